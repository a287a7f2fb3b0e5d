# A stand-in for the parts of nixpkgs the holdfast modules use. Nothing is
# built: a "derivation" here is an attribute set with a name and a store
# path, and keeps what it was made from (the TOML value, the build script)
# so that the tests can look at it.
{ lib }:
let
  fakeDrv =
    name: extra:
    {
      type = "derivation";
      inherit name;
      outPath = "/nix/store/${
        builtins.substring 0 32 (builtins.hashString "sha256" (name + builtins.toJSON extra))
      }-${name}";
    }
    // extra;

  tomlValue = lib.types.anything // {
    description = "TOML value";
    check = v: v != null && !(builtins.isFunction v);
  };

  pkgs = {
    inherit lib;
    formats.toml =
      { }:
      {
        type = lib.types.attrsOf tomlValue;
        generate = name: value: fakeDrv name { passthru.value = value; };
      };
    runCommand =
      name: env: script:
      fakeDrv name { passthru = { inherit env script; }; };
    callPackage =
      f: overrides:
      let
        fn = if builtins.isPath f then import f else f;
      in
      fn (builtins.intersectAttrs (builtins.functionArgs fn) pkgs // overrides);
    rustPlatform = {
      # Not hashed from its source: a path in builtins.toJSON would copy the
      # whole checkout (target/ included) into the store.
      buildRustPackage =
        a:
        fakeDrv "${a.pname}-${a.version}" { } // {
          passthru.args = removeAttrs a [ "src" ];
          srcIsPath = builtins.isPath a.src;
        };
      bindgenHook = fakeDrv "rust-bindgen-hook" { };
    };
    # Keeps its arguments (src left out, as above) for the tests to read.
    buildGoModule =
      a:
      fakeDrv "${a.pname}-${a.version}" { } // {
        passthru.args = removeAttrs a [ "src" ];
        srcIsPath = a.src ? outPath || builtins.isPath a.src || builtins.isString a.src;
      };
    pkg-config = fakeDrv "pkg-config" { };
    protobuf = fakeDrv "protobuf" { };
    cryptsetup = fakeDrv "cryptsetup" { };
    openssl = fakeDrv "openssl" { };
    coreutils = fakeDrv "coreutils" { };
    bash = fakeDrv "bash" { };
    etcd = fakeDrv "etcd" { };
    clevis = fakeDrv "clevis" { };
    util-linux = fakeDrv "util-linux" { };
    e2fsprogs = fakeDrv "e2fsprogs" { };
    systemd = fakeDrv "systemd" { };
  };
in
pkgs
