# services.holdfast.provision: unlocks the etcd data volume through
# Clevis/Tang, gates readiness on the fsync probe and applies CPU/IO tuning,
# at every boot. The unit follows systemd/holdfast-provision.service (root,
# device access, no mount namespace: the volume must be visible to the etcd
# member). First-boot formatting (`holdfast-provision disk`) stays an
# operator step, as on Debian.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.holdfast.provision;
  common = import ./common.nix { inherit lib pkgs; };
  inherit (lib) mkOption types;
  freeform = options: common.settingsType options;
  servers = cfg.settings.tang.servers;
  halls = lib.unique (map (s: s.hall) servers);
  configFile = common.checkedConfig {
    name = "holdfast-provision.toml";
    inherit (cfg) package settings;
    program = "holdfast-provision";
    enable = cfg.checkConfig;
  };
  exe = "${cfg.package}/bin/holdfast-provision";
in
{
  options.services.holdfast.provision = common.daemonOptions {
    title = "holdfast provisioning (Clevis/Tang unlock, fsync probe, CPU/IO tuning)";
    checkDescription = "Check the generated provision.toml at build time with `holdfast-provision check`.";
    settingsDescription = "provision.toml (see config/provision.toml). Only the keys below are read by the module.";
    settingsOptions = {
      tang = mkOption {
        default = { };
        type = freeform {
          threshold = mkOption {
            type = types.int;
            default = 1;
            description = "How many Tang servers must answer (sss threshold). 1: the loss of one hall never keeps a node locked.";
          };
          servers = mkOption {
            default = [ ];
            description = "The Tang servers, each in its own hall.";
            type = types.listOf (freeform {
              url = mkOption {
                type = types.str;
                description = "The Tang server's URL.";
              };
              hall = mkOption {
                type = types.str;
                description = "The hall the Tang server stands in.";
              };
            });
          };
        };
      };
      tune = mkOption {
        default = { };
        type = freeform {
          unit_dir = mkOption {
            type = types.str;
            default = "/run/systemd/system";
            description = "Where `tune` writes the holdfast-etcd@.service.d/ drop-in. On NixOS /etc/systemd/system is read-only (the store), so the default is the runtime directory: the unit runs at every boot.";
          };
        };
      };
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = lib.length servers >= 2;
        message = "services.holdfast.provision.settings.tang.servers has ${toString (lib.length servers)} Tang server(s): with fewer than two, losing one server (or its hall) keeps every node locked; list at least two, in different halls";
      }
      {
        assertion = lib.length servers < 2 || lib.length halls >= 2;
        message = "services.holdfast.provision.settings.tang.servers all stand in hall ${lib.concatStringsSep ", " halls}: losing that hall keeps every node locked; put them in at least two halls";
      }
      {
        assertion = cfg.settings.tang.threshold >= 1 && cfg.settings.tang.threshold <= lib.length servers;
        message = "services.holdfast.provision.settings.tang.threshold = ${toString cfg.settings.tang.threshold} must be between 1 and the number of Tang servers (${toString (lib.length servers)})";
      }
    ];
    environment.systemPackages = [ cfg.package ];
    systemd.services.holdfast-provision = {
      description = "holdfast provisioning (Clevis/Tang unlock, fsync probe, CPU/IO tuning)";
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      wantedBy = [ "multi-user.target" ];
      # Not restarted by a switch (so no restartTriggers): restarting it
      # restarts the etcd member (Requires=). A changed config takes effect
      # at the next boot or `systemctl restart holdfast-provision`.
      restartIfChanged = false;
      path = [
        pkgs.clevis
        pkgs.cryptsetup
        pkgs.util-linux
        pkgs.e2fsprogs
        pkgs.systemd
      ];
      serviceConfig = common.provisionHardening // {
        Type = "oneshot";
        RemainAfterExit = "yes";
        ExecStartPre = "${exe} check --config ${configFile}";
        ExecStart = [
          "${exe} unlock --config ${configFile}"
          "${exe} probe --config ${configFile}"
          "${exe} tune --config ${configFile}"
        ];
        Restart = "on-failure";
        RestartSec = "15s";
        TimeoutStartSec = "5min";
        StateDirectory = "holdfast-provision";
      };
    };
  };
}
