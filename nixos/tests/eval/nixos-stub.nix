# The NixOS options the holdfast modules define, declared loosely (values
# are merged like nixpkgs merges them, not checked field by field). A
# module that sets anything else fails with "The option ... does not exist".
{ lib, ... }:
let
  inherit (lib) mkOption types;
  loose = mkOption {
    type = types.attrsOf types.anything;
    default = { };
  };
in
{
  options = {
    assertions = mkOption {
      type = types.listOf types.anything;
      default = [ ];
    };
    warnings = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
    systemd.services = loose;
    systemd.sockets = loose;
    systemd.tmpfiles.rules = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
    systemd.tmpfiles.settings = loose;
    users.users = loose;
    users.groups = loose;
    environment.etc = loose;
    environment.systemPackages = mkOption {
      type = types.listOf types.package;
      default = [ ];
    };
    networking.firewall.allowedTCPPorts = mkOption {
      type = types.listOf types.port;
      default = [ ];
    };
  };
}
