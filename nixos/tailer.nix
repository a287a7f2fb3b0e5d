# services.holdfast.tailer: records etcd's lock history into the audit
# store (one active per cluster). The unit follows
# systemd/holdfast-tailer.service: no ExecReload= (the tailer does not
# handle SIGHUP); a changed config restarts it (restartTriggers) and it
# resumes from its checkpoint. Sink secrets: LoadCredential= in
# serviceConfig and *_file keys under /run/credentials/holdfast-tailer.service.
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
  configFile = common.checkedConfig {
    name = "holdfast-tailer.toml";
    inherit (cfg) package settings;
    program = "holdfast-tailer";
    enable = cfg.checkConfig;
  };
  exe = "${cfg.package}/bin/holdfast-tailer";
in
{
  options.services.holdfast.tailer = {
    enable = lib.mkEnableOption "the holdfast audit tailer";
    package = common.packageOption;
    checkConfig = mkOption {
      type = types.bool;
      default = true;
      description = "Check the generated tailer.toml at build time with `holdfast-tailer check`.";
    };
    settings = mkOption {
      default = { };
      description = "tailer.toml (see config/tailer.toml). Only the keys below are read by the module.";
      type = common.settingsType {
        store_dir = mkOption {
          type = types.str;
          default = "/var/lib/holdfast/audit";
          description = "The audit store. Must be under /var/lib/holdfast, the unit's only writable directory (ProtectSystem=strict, StateDirectory=holdfast).";
        };
      };
    };
  };

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
      common.users
      {
        assertions = [
          {
            assertion = lib.hasPrefix "/var/lib/holdfast/" cfg.settings.store_dir;
            message = "services.holdfast.tailer.settings.store_dir = \"${cfg.settings.store_dir}\" is not under /var/lib/holdfast/, the only directory the unit may write (ProtectSystem=strict)";
          }
        ];
        environment.systemPackages = [ cfg.package ];
        systemd.services.holdfast-tailer = {
          description = "holdfast audit tailer (records etcd's lock history)";
          after = [ "network-online.target" ];
          wants = [ "network-online.target" ];
          wantedBy = [ "multi-user.target" ];
          restartTriggers = [ configFile ];
          serviceConfig = common.hardening // {
            Type = "notify";
            NotifyAccess = "main";
            ExecStartPre = "${exe} check --config ${configFile}";
            ExecStart = "${exe} --config ${configFile} --log-format plain";
            TimeoutStartSec = "90s";
            WatchdogSec = "30s";
            TimeoutStopSec = "30s";
            Restart = "on-failure";
            RestartSec = "2s";
            User = "holdfast";
            Group = "holdfast";
            RuntimeDirectory = "holdfast-tailer";
            StateDirectory = "holdfast";
            ConfigurationDirectory = "holdfast";
            ConfigurationDirectoryMode = "0750";
          };
        };
      }
    ]
  );
}
