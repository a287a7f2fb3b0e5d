# The etcd holdfast ships, built the way packaging/etcd/build builds it for
# the .deb and .rpm: etcd, etcdctl and etcdutl of the version
# packaging/etcd/go.mod pins (the one place that names it), from exactly the
# modules packaging/etcd/go.sum lists, statically linked.
#
# vendorHash is the Nix hash of `go mod vendor` run in packaging/etcd; the
# NixOS test (tests/tests/nixos.rs) recomputes it, so moving to another
# 3.6.x without updating it fails there instead of on the first NixOS build.
# Needs a nixpkgs whose Go is at least go.mod's `go` line (1.26).
{ buildGoModule }:
let
  goMod = builtins.readFile ../packaging/etcd/go.mod;
  pinned = builtins.match ".*[[:space:]]go\\.etcd\\.io/etcd/server/v3 v(3\\.[0-9]+\\.[0-9]+)[[:space:]].*" goMod;
  version =
    if pinned == null then
      throw "packaging/etcd/go.mod names no go.etcd.io/etcd/server/v3 version"
    else
      builtins.head pinned;
in
buildGoModule {
  pname = "holdfast-etcd";
  inherit version;
  # go.mod and go.sum only: the build script stays out of the source hash.
  src = builtins.path {
    name = "holdfast-etcd-modules";
    path = ../packaging/etcd;
    filter = path: _type: builtins.elem (baseNameOf path) [ "go.mod" "go.sum" ];
  };
  vendorHash = "sha256-W+3/EaU+gVZBABPwZ+67l4YgNJiXnYTd7/n94u3PL5c=";
  env.CGO_ENABLED = 0;
  # The three tools are packages of the modules go.mod requires, not of
  # this module, so they are built by import path.
  buildPhase = ''
    runHook preBuild
    for m in server etcdctl etcdutl; do
      name=$m
      [ "$m" = server ] && name=etcd
      go build -ldflags='-s -w' -o "bin/$name" "go.etcd.io/etcd/$m/v3"
    done
    runHook postBuild
  '';
  installPhase = ''
    runHook preInstall
    install -Dm755 -t "$out/bin" bin/etcd bin/etcdctl bin/etcdutl
    runHook postInstall
  '';
  doCheck = false;
  # The same version checks as packaging/etcd/build.
  doInstallCheck = true;
  # (Each output read whole first: under pipefail, `| grep -q` can fail when
  # the tool dies of SIGPIPE after grep exits.)
  installCheckPhase = ''
    said=$("$out/bin/etcd" --version); grep -qx "etcd Version: ${version}" <<<"$said"
    said=$("$out/bin/etcdctl" version); grep -qx "etcdctl version: ${version}" <<<"$said"
    said=$("$out/bin/etcdutl" version); grep -qx "etcdutl version: ${version}" <<<"$said"
  '';
  meta = {
    description = "etcd ${version} as holdfast ships it (server, etcdctl, etcdutl)";
    mainProgram = "etcd";
  };
}
