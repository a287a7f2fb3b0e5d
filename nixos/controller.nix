# services.holdfast.controller: validates the class and grant set and
# publishes it to etcd (one active per cluster). The unit follows
# systemd/holdfast-controller.service. `classes` and `grants` become
# classes.d/nixos.toml and grants.d/nixos.toml of a policy directory in the
# store, which settings.policy_dir points at by default; the set is
# checked at build time with `holdfast-controller check --offline`. It runs
# as its own user holdfast-controller, with no state directory: its key
# (etcd-controller-key.pem) is root:holdfast-controller 0640; for a
# policy_dir kept in /etc/holdfast, classes.d and grants.d are
# root:holdfast-controller 0750 (their files 0640).
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.holdfast.controller;
  common = import ./common.nix { inherit lib pkgs; };
  inherit (lib) mkOption types;
  toml = common.tomlFormat;
  noNulls = lib.filterAttrs (_: v: v != null);

  # Only the keys the module's assertions read are typed; the controller
  # itself checks the rest (docs/policy.md lists every key and rule).
  classType = types.submodule {
    freeformType = toml.type;
    options = {
      enforcement = mkOption {
        type = types.enum [
          "fenced"
          "advisory"
        ];
        description = "fenced: the resource refuses stale tokens (a pause test passed for `resource` at `resource_schema_version`; without one the controller publishes the class demoted to advisory). advisory: needs risk_owner and waiver_expires.";
      };
      risk_owner = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "The team that accepts the risk of an advisory class.";
      };
      waiver_expires = mkOption {
        type = types.nullOr (types.strMatching "[0-9]{4}-[0-9]{2}-[0-9]{2}");
        default = null;
        description = "YYYY-MM-DD: the day the waiver of an advisory class must be renewed. Written as a TOML date (policy-dir.sh), which pkgs.formats.toml cannot express.";
      };
      on_quorum_loss = mkOption {
        type = types.enum [
          "closed"
          "open"
        ];
        default = "closed";
        description = "closed: grant nothing without a majority. open: only for efficiency classes that are not fenced.";
      };
    };
  };

  classesFile = toml.generate "classes.toml" { class = lib.mapAttrs (_: noNulls) cfg.classes; };
  grantsFile = toml.generate "grants.toml" { grant = cfg.grants; };
  policyDir = pkgs.runCommand "holdfast-policy" { nativeBuildInputs = [ pkgs.bash ]; } ''
    bash ${./policy-dir.sh} ${classesFile} ${if cfg.grants != { } then "${grantsFile}" else "-"} $out
  '';

  classAssertions = lib.concatMap (
    name:
    let
      c = cfg.classes.${name};
      at = "services.holdfast.controller.classes.${name}";
    in
    [
      {
        assertion = c.enforcement != "advisory" || (c.risk_owner != null && c.risk_owner != "");
        message = "${at} is advisory but names no risk_owner; set risk_owner = \"TEAM\" (the team that accepts the risk until the class is fenced), or make it fenced once holdfast-pausetest has passed";
      }
      {
        assertion = c.enforcement != "fenced" || (c ? resource && c ? resource_schema_version);
        message = "${at} is fenced but lacks resource or resource_schema_version; set both as `holdfast-pausetest status --json` prints them (\"resource\", \"current_schema_version\"): a pause-test result counts only for that resource at that schema version";
      }
      {
        assertion = !(c.enforcement == "fenced" && c.on_quorum_loss == "open");
        message = "${at} is fenced with on_quorum_loss = \"open\": grants made without a majority carry token 0, which a fenced resource must refuse; set on_quorum_loss = \"closed\"";
      }
    ]
  ) (lib.attrNames cfg.classes);
in
{
  options.services.holdfast.controller =
    common.daemonOptions {
      title = "the holdfast controller";
      checkDescription = "Check controller.toml and the class set at build time with `holdfast-controller check --offline`.";
      settingsDescription = "controller.toml (see config/controller.toml). Only the keys below are read by the module.";
      settingsOptions = {
        policy_dir = mkOption {
          type = types.str;
          default = "${policyDir}";
          defaultText = lib.literalExpression "a store directory with classes.d/ and grants.d/ from `classes` and `grants`";
          description = "The directory holding classes.d/ and grants.d/. Elsewhere than the store (e.g. /etc/holdfast, as on Debian): readable by holdfast-controller, written by root only.";
        };
      };
    }
    // {
      classes = mkOption {
        type = types.attrsOf classType;
        default = { };
        description = "Lock classes, [class.NAME] of classes.d (see config/classes.d/dev.toml, docs/policy.md).";
      };
      grants = mkOption {
        type = types.attrsOf toml.type;
        default = { };
        description = "Grants, [grant.NAME] of grants.d (see config/grants.d/dev.toml).";
      };
    };

  config = common.daemonConfig {
    inherit cfg;
    name = "controller";
    userDescription = "holdfast controller";
    description = "holdfast controller (publishes the validated class set)";
    checkArgs = [ "--offline" ];
    tmpfiles = {
      "/etc/holdfast/classes.d" = common.tmpfile "0750" "root" "holdfast-controller";
      "/etc/holdfast/grants.d" = common.tmpfile "0750" "root" "holdfast-controller";
    };
    config.assertions = classAssertions;
  };
}
