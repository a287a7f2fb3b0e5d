# Shared by the holdfast NixOS modules: the hardening of systemd/*.service
# (the one source of unit files; tests/tests/nixos.rs compares these key by
# key with the unit files), the build-time config check, the daemons' users
# (systemd/sysusers.d) and directories (systemd/tmpfiles.d), and the options
# and unit every daemon module has (daemonOptions, daemonConfig): a daemon's
# module is its own options and settings plus one call of each.
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

  # The options of a module whose program reads a TOML file and has a
  # `check` subcommand: enable, package, checkConfig and settings (any
  # TOML, plus the typed `settingsOptions` the module reads).
  daemonOptions =
    {
      title,
      checkDescription,
      settingsDescription,
      settingsOptions ? { },
    }:
    {
      enable = lib.mkEnableOption title;
      package = packageOption;
      checkConfig = lib.mkOption {
        type = lib.types.bool;
        default = true;
        description = checkDescription;
      };
      settings = lib.mkOption {
        default = { };
        description = settingsDescription;
        type = settingsType settingsOptions;
      };
    };

  # The config of a long-running daemon's module (from daemonOptions), as
  # systemd/holdfast-{arbiter,controller,tailer}.service run it: its own
  # user and group holdfast-NAME (daemonUser), the config file checked at
  # build time and by ExecStartPre=, Type=notify with the watchdog, the
  # hardening, restarted when the config changes. `state` (optional):
  # { dir; mode; setting; } is its one writable directory,
  # /var/lib/holdfast/DIR (StateDirectory=holdfast/DIR, mode MODE), and the
  # settings key that must lie in it (asserted). `config`: the module's
  # other config (its assertions come before the state one).
  daemonConfig =
    {
      cfg,
      name,
      userDescription,
      description,
      checkArgs ? [ ],
      reload ? true,
      state ? null,
      tmpfiles ? { },
      after ? [ ],
      requires ? [ ],
      serviceConfig ? { },
      config ? { },
    }:
    let
      program = "holdfast-${name}";
      exe = "${cfg.package}/bin/${program}";
      configFile = checkedConfig {
        name = "${program}.toml";
        inherit (cfg) package settings;
        inherit program checkArgs;
        enable = cfg.checkConfig;
      };
      check = lib.concatStringsSep " " ([ "${exe} check" ] ++ checkArgs ++ [ "--config ${configFile}" ]);
      stateDir = "/var/lib/holdfast/${state.dir}";
      stateValue = cfg.settings.${state.setting};
    in
    lib.mkIf cfg.enable (
      lib.mkMerge [
        (daemonUser program userDescription)
        (removeAttrs config [ "assertions" ])
        {
          assertions =
            config.assertions or [ ]
            ++ lib.optional (state != null) {
              assertion = within stateDir stateValue;
              message = "services.holdfast.${name}.settings.${state.setting} = \"${stateValue}\" is not in ${stateDir}, the only directory the unit may write (StateDirectory=holdfast/${state.dir}, ProtectSystem=strict)";
            };
          systemd.tmpfiles.settings.holdfast = etcDirs // lib.optionalAttrs (state != null) stateParent // tmpfiles;
          environment.systemPackages = [ cfg.package ];
          systemd.services.${program} = {
            inherit description;
            after = [ "network-online.target" ] ++ after;
            wants = [ "network-online.target" ];
            wantedBy = [ "multi-user.target" ];
            restartTriggers = [ configFile ];
            serviceConfig =
              hardening
              // {
                Type = "notify";
                NotifyAccess = "main";
                ExecStartPre = check;
                ExecStart = "${exe} --config ${configFile} --log-format plain";
                TimeoutStartSec = "90s";
                WatchdogSec = "30s";
                TimeoutStopSec = "30s";
                Restart = "on-failure";
                RestartSec = "2s";
                User = program;
                Group = program;
                RuntimeDirectory = program;
              }
              // lib.optionalAttrs reload {
                ExecReload = [
                  check
                  "${pkgs.coreutils}/bin/kill -HUP $MAINPID"
                ];
              }
              // lib.optionalAttrs (state != null) {
                StateDirectory = "holdfast/${state.dir}";
                StateDirectoryMode = state.mode;
              }
              // serviceConfig;
          }
          // lib.optionalAttrs (requires != [ ]) { inherit requires; };
        }
      ]
    );
}
