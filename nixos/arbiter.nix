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
  stateDir = "/var/lib/holdfast/arbiter";
in
{
  options.services.holdfast.arbiter =
    common.daemonOptions {
      title = "the holdfast arbiter";
      checkDescription = "Check the generated arbiter.toml at build time with `holdfast-arbiter check` (TLS files outside the store get stand-ins; ExecStartPre= checks the real ones).";
      settingsDescription = "arbiter.toml (see config/arbiter.toml for every key). Only the keys below are read by the module.";
      settingsOptions = {
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
    }
    // {
      openFirewall = mkOption {
        type = types.bool;
        default = false;
        description = "Open the lock.v1 port (from settings.listen) in the firewall.";
      };
    };

  config = common.daemonConfig {
    inherit cfg;
    name = "arbiter";
    userDescription = "holdfast arbiter";
    description = "holdfast arbiter (lock service with fencing tokens)";
    state = {
      dir = "arbiter";
      mode = "0700";
      setting = "state_dir";
    };
    after = [ "holdfast-arbiter.socket" ];
    requires = [ "holdfast-arbiter.socket" ];
    serviceConfig = {
      Sockets = "holdfast-arbiter.socket";
      LimitNOFILE = 65536;
    };
    config = {
      assertions = [
        {
          assertion = port > 0 && port < 65536;
          message = "services.holdfast.arbiter.settings.listen = \"${cfg.settings.listen}\" has no port: write ADDRESS:PORT";
        }
      ];
      networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall port;
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
    };
  };
}
