# holdfast from this repository's source: the daemons, holdfastctl and the
# harness binaries of the workspace. Not built on the machines that run the
# tests (no nixpkgs there); evaluated only against nixos/tests/eval.
{
  lib,
  rustPlatform,
  pkg-config,
  protobuf,
  cryptsetup,
}:
let
  workspace = (lib.importTOML ../Cargo.toml).workspace.package;
in
rustPlatform.buildRustPackage {
  pname = "holdfast";
  inherit (workspace) version;
  src = lib.cleanSource ../.;
  cargoLock.lockFile = ../Cargo.lock;
  # etcd-client's build runs protoc (and needs the well-known types);
  # libcryptsetup-rs (holdfast-provision) is bound with bindgen.
  nativeBuildInputs = [
    pkg-config
    protobuf
    rustPlatform.bindgenHook
  ];
  buildInputs = [ cryptsetup ];
  PROTOC = "${protobuf}/bin/protoc";
  # The workspace tests start real etcd members and systemd tools; they run
  # in the repository's own CI, not in the sandbox.
  doCheck = false;
  # The shipped holdfastctl leaves the dev appliance out, as packaging/build does.
  buildNoDefaultFeatures = true;
  meta = {
    description = "Distributed lock service with fencing tokens on etcd";
    license = lib.licenses.asl20;
    platforms = lib.platforms.linux;
    mainProgram = "holdfastctl";
  };
}
