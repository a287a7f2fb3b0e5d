# Shared by the holdfast NixOS modules: the hardening of systemd/*.service
# (the one source of unit files; tests/tests/nixos.rs compares these key by
# key with the unit files) and the build-time config check.
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

  # systemd/holdfast-etcd@.service: the same without PrivateUsers= (it maps
  # supplementary groups to nobody; the member reads its keys through its
  # supplementary group holdfast).
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

  users = {
    users.users.holdfast = {
      isSystemUser = true;
      group = "holdfast";
      home = "/var/lib/holdfast";
      description = "holdfast daemons";
    };
    users.groups.holdfast = { };
  };

  packageOption = lib.mkOption {
    type = lib.types.package;
    default = pkgs.callPackage ./package.nix { };
    defaultText = lib.literalExpression "pkgs.callPackage ./package.nix { }";
    description = "The holdfast package (daemons and holdfastctl).";
  };
}
