# Evaluates nixos/default.nix with `configuration` against the stub module
# system (lib.nix, pkgs.nix, nixos-stub.nix). Used by tests/tests/nixos.rs:
#   nix-instantiate --eval --strict --json --store dummy:// -E \
#     'let r = import nixos/tests/eval/eval.nix { configuration = { ... }; }; in ...'
{
  configuration ? { },
}:
let
  lib = import ./lib.nix;
  pkgs = import ./pkgs.nix { inherit lib; };
  result = lib.evalModules {
    modules = [
      ./nixos-stub.nix
      ../../default.nix
      configuration
    ];
    specialArgs = { inherit pkgs; };
  };
in
result
// {
  inherit lib pkgs;
  # The messages of the assertions that fail, as NixOS would print them.
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) result.config.assertions);
}
