# services.holdfast.etcd: one etcd member of a holdfast lock cluster, as
# systemd/holdfast-etcd@.service runs it: the unit is holdfast-etcd@NAME
# (so holdfast-provision's tune drop-in in holdfast-etcd@.service.d applies),
# data in /var/lib/holdfast-etcd/NAME (0700), 8 GiB quota, hourly periodic
# compaction, lease checkpointing, client and peer TLS with client
# certificates. The unit's ExecStartPre= guard over the env file becomes
# assertions here: the settings are known at evaluation time. It runs as
# user holdfast-etcd, in no other group: its keys in /etc/holdfast/tls are
# root:holdfast-etcd 0640.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.holdfast.etcd;
  common = import ./common.nix { inherit lib pkgs; };
  inherit (lib) mkOption types;
  env = cfg.settings // {
    ETCD_NAME = cfg.name;
    ETCD_CLIENT_CERT_AUTH = "true";
    ETCD_PEER_CLIENT_CERT_AUTH = "true";
  };
  # What the unit fixes on the command line (etcd refuses a variable that
  # repeats a flag), and what it requires.
  fixed = [
    "ETCD_DATA_DIR"
    "ETCD_QUOTA_BACKEND_BYTES"
    "ETCD_AUTO_COMPACTION_MODE"
    "ETCD_AUTO_COMPACTION_RETENTION"
    "ETCD_LOGGER"
    "ETCD_CLIENT_CERT_AUTH"
    "ETCD_PEER_CLIENT_CERT_AUTH"
    "ETCD_NAME"
  ];
  required = [
    "ETCD_CERT_FILE"
    "ETCD_KEY_FILE"
    "ETCD_TRUSTED_CA_FILE"
    "ETCD_PEER_CERT_FILE"
    "ETCD_PEER_KEY_FILE"
    "ETCD_PEER_TRUSTED_CA_FILE"
    "ETCD_LISTEN_CLIENT_URLS"
    "ETCD_LISTEN_PEER_URLS"
  ];
  urlVars = [
    "ETCD_LISTEN_CLIENT_URLS"
    "ETCD_LISTEN_PEER_URLS"
    "ETCD_ADVERTISE_CLIENT_URLS"
    "ETCD_INITIAL_ADVERTISE_PEER_URLS"
  ];
  urls = lib.concatMap (v: lib.filter (u: u != "") (lib.splitString "," (cfg.settings.${v} or ""))) urlVars;
  plain = lib.filter (u: !(lib.hasPrefix "https://" u)) urls;
  unit = "holdfast-etcd@${cfg.name}";
in
{
  options.services.holdfast.etcd = {
    enable = lib.mkEnableOption "one holdfast etcd member";
    package = mkOption {
      type = types.package;
      default = pkgs.callPackage ./etcd-package.nix { };
      defaultText = lib.literalExpression "the etcd packaging/etcd/go.mod pins (nixos/etcd-package.nix)";
      description = "The etcd package: by default the one holdfast ships and tests, built from packaging/etcd (go.mod names its version, go.sum its modules). Another etcd is unsupported; for 3.4 set versionFlags to its flags.";
    };
    name = mkOption {
      type = types.str;
      description = "The member's name (etcd --name, the host name in `holdfast-provision plan`); the unit is holdfast-etcd@NAME.";
    };
    versionFlags = mkOption {
      type = types.str;
      default = "--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true";
      description = "The lease-checkpoint flags for the etcd version: the default is the pinned 3.6's (3.4: --logger=zap --experimental-enable-lease-checkpoint=true --experimental-enable-lease-checkpoint-persist=true).";
    };
    settings = mkOption {
      type = types.attrsOf types.str;
      default = { };
      description = "etcd's ETCD_* variables for this member (config/etcd/member.env.example; `holdfast-provision plan` writes them). Paths only: keys stay in /etc/holdfast/tls, root:holdfast-etcd 0640.";
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = lib.all (v: !(cfg.settings ? ${v})) fixed;
        message = "services.holdfast.etcd.settings sets ${
          lib.concatStringsSep ", " (lib.filter (v: cfg.settings ? ${v}) fixed)
        }: the module fixes these (data dir, quota, compaction, logger, client-certificate auth, name = services.holdfast.etcd.name); remove them";
      }
      {
        assertion = lib.all (v: (cfg.settings.${v} or "") != "") required;
        message = "services.holdfast.etcd.settings lacks ${
          lib.concatStringsSep ", " (lib.filter (v: (cfg.settings.${v} or "") == "") required)
        }: client and peer TLS with client certificates are required";
      }
      {
        assertion = (cfg.settings.ETCD_PEER_CERT_ALLOWED_CN or "") != "" || (cfg.settings.ETCD_PEER_CERT_ALLOWED_HOSTNAME or "") != "";
        message = "services.holdfast.etcd.settings lacks ETCD_PEER_CERT_ALLOWED_CN (the CN every member certificate shares; holdfast-provision plan writes: holdfast etcd member) or ETCD_PEER_CERT_ALLOWED_HOSTNAME: without either, any client certificate of the etcd CA is taken as a Raft peer";
      }
      {
        assertion = plain == [ ];
        message = "services.holdfast.etcd.settings: ${lib.concatStringsSep ", " plain}: every URL must be https://";
      }
    ];
    users.users.holdfast-etcd = {
      isSystemUser = true;
      group = "holdfast-etcd";
      home = "/var/lib/holdfast-etcd";
      description = "holdfast etcd member";
    };
    users.groups.holdfast-etcd = { };
    systemd.tmpfiles.settings.holdfast = common.etcDirs;
    environment.systemPackages = [ cfg.package ];

    systemd.services.${unit} = {
      description = "holdfast etcd member ${cfg.name}";
      after = [
        "network-online.target"
        "holdfast-provision.service"
      ];
      wants = [ "network-online.target" ];
      # systemd/holdfast-etcd@.service.d/10-holdfast-provision.conf
      requires = lib.optional config.services.holdfast.provision.enable "holdfast-provision.service";
      wantedBy = [ "multi-user.target" ];
      environment = env;
      restartTriggers = [ (builtins.toJSON env) ];
      serviceConfig = common.etcdHardening // {
        Type = "notify";
        NotifyAccess = "main";
        ExecStart = "${cfg.package}/bin/etcd --data-dir=/var/lib/holdfast-etcd/${cfg.name} --quota-backend-bytes=8589934592 --auto-compaction-mode=periodic --auto-compaction-retention=1h ${cfg.versionFlags}";
        TimeoutStartSec = "5min";
        TimeoutStopSec = "60s";
        Restart = "on-failure";
        RestartSec = "5s";
        LimitNOFILE = 65536;
        User = "holdfast-etcd";
        Group = "holdfast-etcd";
        StateDirectory = "holdfast-etcd/${cfg.name}";
        StateDirectoryMode = "0700";
      };
    };
  };
}
