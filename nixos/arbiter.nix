# services.holdfast.arbiter: grants locks with fencing tokens on etcd.
# The unit follows systemd/holdfast-arbiter.service and
# systemd/holdfast-arbiter.socket (the socket keeps the lock.v1 port open
# across restarts); keys stay outside the store, in /etc/holdfast/tls or
# $CREDENTIALS_DIRECTORY (LoadCredential= in serviceConfig). It runs as its
# own user holdfast-arbiter: its keys (arbiter-key.pem, etcd-arbiter-key.pem)
# are root:holdfast-arbiter 0640, its state /var/lib/holdfast/arbiter (0700).
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.holdfast.arbiter;
  common = import ./common.nix { inherit lib pkgs; };
  inherit (lib) mkOption types;
  # "0.0.0.0:7420", "[::]:7420" -> 7420
  portMatch = builtins.match ".*:([0-9]+)" cfg.settings.listen;
  port = if portMatch == null then 0 else lib.toInt (builtins.head portMatch);
  configFile = common.checkedConfig {
    name = "holdfast-arbiter.toml";
    inherit (cfg) package settings;
    program = "holdfast-arbiter";
    enable = cfg.checkConfig;
  };
  exe = "${cfg.package}/bin/holdfast-arbiter";
  stateDir = "/var/lib/holdfast/arbiter";
in
{
  options.services.holdfast.arbiter = {
    enable = lib.mkEnableOption "the holdfast arbiter";
    package = common.packageOption;
    checkConfig = mkOption {
      type = types.bool;
      default = true;
      description = "Check the generated arbiter.toml at build time with `holdfast-arbiter check` (TLS files outside the store get stand-ins; ExecStartPre= checks the real ones).";
    };
    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open the lock.v1 port (from settings.listen) in the firewall.";
    };
    settings = mkOption {
      default = { };
      description = "arbiter.toml (see config/arbiter.toml for every key). Only the keys below are read by the module.";
      type = common.settingsType {
        listen = mkOption {
          type = types.str;
          default = "0.0.0.0:7420";
          description = "Address of the lock.v1 server; its port is the socket unit's ListenStream= and the port openFirewall opens.";
        };
        state_dir = mkOption {
          type = types.str;
          default = stateDir;
          description = "The arbiter's own state (served-epochs.json). Must be /var/lib/holdfast/arbiter or under it, the unit's only writable directory (ProtectSystem=strict, StateDirectory=holdfast/arbiter, holdfast-arbiter 0700).";
        };
      };
    };
  };

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
      (common.daemonUser "holdfast-arbiter" "holdfast arbiter")
      {
        assertions = [
          {
            assertion = port > 0 && port < 65536;
            message = "services.holdfast.arbiter.settings.listen = \"${cfg.settings.listen}\" has no port: write ADDRESS:PORT";
          }
          {
            assertion = common.within stateDir cfg.settings.state_dir;
            message = "services.holdfast.arbiter.settings.state_dir = \"${cfg.settings.state_dir}\" is not in ${stateDir}, the only directory the unit may write (StateDirectory=holdfast/arbiter, ProtectSystem=strict)";
          }
        ];
        systemd.tmpfiles.settings.holdfast = common.etcDirs // common.stateParent;
        networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall port;
        environment.systemPackages = [ cfg.package ];

        systemd.sockets.holdfast-arbiter = {
          description = "holdfast arbiter lock.v1 socket (port ${toString port})";
          wantedBy = [ "sockets.target" ];
          socketConfig = {
            ListenStream = toString port;
            FileDescriptorName = "lock";
            Service = "holdfast-arbiter.service";
            NoDelay = "yes";
            Backlog = 4096;
          };
        };

        systemd.services.holdfast-arbiter = {
          description = "holdfast arbiter (lock service with fencing tokens)";
          after = [
            "network-online.target"
            "holdfast-arbiter.socket"
          ];
          wants = [ "network-online.target" ];
          requires = [ "holdfast-arbiter.socket" ];
          wantedBy = [ "multi-user.target" ];
          restartTriggers = [ configFile ];
          serviceConfig = common.hardening // {
            Type = "notify";
            NotifyAccess = "main";
            Sockets = "holdfast-arbiter.socket";
            ExecStartPre = "${exe} check --config ${configFile}";
            ExecStart = "${exe} --config ${configFile} --log-format plain";
            ExecReload = [
              "${exe} check --config ${configFile}"
              "${pkgs.coreutils}/bin/kill -HUP $MAINPID"
            ];
            TimeoutStartSec = "90s";
            WatchdogSec = "30s";
            TimeoutStopSec = "30s";
            Restart = "on-failure";
            RestartSec = "2s";
            User = "holdfast-arbiter";
            Group = "holdfast-arbiter";
            RuntimeDirectory = "holdfast-arbiter";
            StateDirectory = "holdfast/arbiter";
            StateDirectoryMode = "0700";
            LimitNOFILE = 65536;
          };
        };
      }
    ]
  );
}
