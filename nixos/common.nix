# Shared by the holdfast NixOS modules: the hardening of systemd/*.service
# (the one source of unit files; tests/tests/nixos.rs compares these key by
# key with the unit files), the build-time config check, the daemons' users
# (systemd/sysusers.d) and directories (systemd/tmpfiles.d).
{ lib, pkgs }:
rec {
  # systemd/holdfast-{arbiter,controller,tailer}.service, "# Hardening.".
  hardening = {
    NoNewPrivileges = "yes";
    ProtectSystem = "strict";
    ProtectHome = "yes";
    PrivateTmp = "yes";
    PrivateDevices = "yes";
    PrivateUsers = "yes";
    ProtectKernelTunables = "yes";
    ProtectKernelModules = "yes";
    ProtectKernelLogs = "yes";
    ProtectControlGroups = "yes";
    ProtectClock = "yes";
    ProtectHostname = "yes";
    ProtectProc = "invisible";
    ProcSubset = "pid";
    RestrictNamespaces = "yes";
    RestrictRealtime = "yes";
    RestrictSUIDSGID = "yes";
    RemoveIPC = "yes";
    LockPersonality = "yes";
    MemoryDenyWriteExecute = "yes";
    DevicePolicy = "closed";
    KeyringMode = "private";
    CapabilityBoundingSet = "";
    AmbientCapabilities = "";
    RestrictAddressFamilies = "AF_INET AF_INET6 AF_UNIX";
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service"
      "~@privileged @resources"
    ];
    SystemCallErrorNumber = "EPERM";
    UMask = "0077";
  };

  # systemd/holdfast-etcd@.service: the same without PrivateUsers= (the
  # member's data directory is on the volume holdfast-provision mounts,
  # outside the unit's namespace; see that unit's hardening comment).
  etcdHardening = removeAttrs hardening [ "PrivateUsers" ];

  # systemd/holdfast-provision.service: root, device access, no mount
  # namespace (see that unit's header for why each key is absent).
  provisionHardening = {
    NoNewPrivileges = "yes";
    ProtectHostname = "yes";
    RestrictRealtime = "yes";
    RestrictSUIDSGID = "yes";
    LockPersonality = "yes";
    SystemCallArchitectures = "native";
    RestrictAddressFamilies = "AF_INET AF_INET6 AF_UNIX AF_NETLINK";
    UMask = "0077";
  };

  tomlFormat = pkgs.formats.toml { };

  # The settings type: any TOML (freeform), plus the typed options a
  # module reads.
  settingsType =
    options:
    lib.types.submodule {
      freeformType = tomlFormat.type;
      inherit options;
    };

  # The config file, generated and checked with the daemon's own `check`
  # (check-config.sh: secrets that are not in the sandbox get stand-ins).
  checkedConfig =
    {
      name,
      package,
      program,
      settings,
      checkArgs ? [ ],
      enable ? true,
    }:
    let
      raw = tomlFormat.generate name settings;
    in
    if !enable then
      raw
    else
      pkgs.runCommand name
        {
          nativeBuildInputs = [
            package
            pkgs.openssl
            pkgs.bash
          ];
        }
        ''
          bash ${./check-config.sh} ${raw} ${package}/bin/${program} ${lib.concatStringsSep " " checkArgs}
          cp ${raw} $out
        '';

  # One system user per daemon, as systemd/sysusers.d/holdfast.conf makes
  # them: each with a group of its own name that holds only that user, so a
  # key that is root:<daemon> 0640 is readable by that daemon alone. There
  # is no shared `holdfast` user any more (a host that had one keeps it;
  # nothing runs as it).
  daemonUser = name: description: {
    users.users.${name} = {
      isSystemUser = true;
      group = name;
      inherit description;
    };
    users.groups.${name} = { };
  };

  # The directories systemd/tmpfiles.d/holdfast.conf makes, as
  # systemd.tmpfiles.settings (entries defined by several modules merge,
  # where duplicate systemd.tmpfiles.rules lines would not). Only root
  # writes /etc/holdfast; /etc/holdfast and tls are traversable, not
  # listable (a daemon reaches its own files by name).
  tmpfile = mode: user: group: {
    d = { inherit mode user group; };
  };
  etcDirs = {
    "/etc/holdfast" = tmpfile "0711" "root" "root";
    "/etc/holdfast/tls" = tmpfile "0711" "root" "root";
  };
  # The parent of the daemons' state directories (StateDirectory=
  # holdfast/arbiter, holdfast/audit): root's, so no daemon writes beside
  # another (`d` also takes it back from an old `holdfast` owner).
  stateParent = {
    "/var/lib/holdfast" = tmpfile "0755" "root" "root";
  };

  # Whether `path` is `dir` or below it, with no `..` that climbs out: what
  # a unit with ProtectSystem=strict may write when `dir` is its
  # StateDirectory=.
  within = dir: path: (path == dir || lib.hasPrefix "${dir}/" path) && builtins.match "(.*/)?[.][.](/.*)?" path == null;

  packageOption = lib.mkOption {
    type = lib.types.package;
    default = pkgs.callPackage ./package.nix { };
    defaultText = lib.literalExpression "pkgs.callPackage ./package.nix { }";
    description = "The holdfast package (daemons and holdfastctl).";
  };
}
