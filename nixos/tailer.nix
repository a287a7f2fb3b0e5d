# services.holdfast.tailer: records etcd's lock history into the audit
# store (one active per cluster). The unit follows
# systemd/holdfast-tailer.service: no ExecReload= (the tailer does not
# handle SIGHUP); a changed config restarts it (restartTriggers) and it
# resumes from its checkpoint. Sink secrets: LoadCredential= in
# serviceConfig and *_file keys under /run/credentials/holdfast-tailer.service.
#
# It runs as its own user holdfast-tailer with Group=holdfast-audit, the
# group of the audit store's readers (`holdfastctl audit`; add operators to
# it): the store is /var/lib/holdfast/audit, holdfast-tailer:holdfast-audit
# 0750 with files 0640 (UMask=0027). That group is shared, so the tailer's
# etcd keys are root:root 0600 and reach the unit by LoadCredential=, each
# under its file name; the daemon reads $CREDENTIALS_DIRECTORY/<file name of
# key_file> when it is there, so settings keep the /etc/holdfast/tls path
# (and `holdfast-tailer check` run as root reads the real file). A changed
# key needs a restart: credentials are copied at start.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.holdfast.tailer;
  common = import ./common.nix { inherit lib pkgs; };
  inherit (lib) mkOption types;
  storeDir = "/var/lib/holdfast/audit";
  # The etcd client keys the settings name ([etcd] and [coord] key_file),
  # except those already under /run/credentials: credential ID = file name.
  keyFiles = lib.unique (
    lib.filter (f: f != null && !(lib.hasPrefix "/run/credentials/" f)) [
      (cfg.settings.etcd.key_file or null)
      (cfg.settings.coord.key_file or null)
    ]
  );
  keyNames = map baseNameOf keyFiles;
in
{
  options.services.holdfast.tailer = common.daemonOptions {
    title = "the holdfast audit tailer";
    checkDescription = "Check the generated tailer.toml at build time with `holdfast-tailer check`.";
    settingsDescription = "tailer.toml (see config/tailer.toml). The module reads the keys below, and etcd.key_file and coord.key_file: each is handed to the unit with LoadCredential= under its file name (keep the key root:root 0600).";
    settingsOptions = {
      store_dir = mkOption {
        type = types.str;
        default = storeDir;
        description = "The audit store. Must be /var/lib/holdfast/audit or under it, the unit's only writable directory (ProtectSystem=strict, StateDirectory=holdfast/audit: holdfast-tailer:holdfast-audit 0750).";
      };
    };
  };

  config = common.daemonConfig {
    inherit cfg;
    name = "tailer";
    userDescription = "holdfast audit tailer";
    description = "holdfast audit tailer (records etcd's lock history)";
    # The tailer does not handle SIGHUP.
    reload = false;
    state = {
      dir = "audit";
      mode = "0750";
      setting = "store_dir";
    };
    serviceConfig = {
      Group = "holdfast-audit";
      # The store's files 0640, readable by group holdfast-audit
      # (checkpoint.json and withheld.jsonl 0600: they may name a
      # live hold's revision).
      UMask = "0027";
    }
    // lib.optionalAttrs (keyFiles != [ ]) {
      LoadCredential = map (f: "${baseNameOf f}:${f}") keyFiles;
    };
    config = {
      users.groups.holdfast-audit = { };
      assertions = [
        {
          assertion = lib.length (lib.unique keyNames) == lib.length keyNames;
          message = "services.holdfast.tailer.settings: etcd.key_file and coord.key_file are different files with one file name (${lib.concatStringsSep ", " keyFiles}): each is handed to the unit as a credential named after its file, so rename one";
        }
      ];
    };
  };
}
