# A three-node holdfast cluster in three halls, as a NixOS VM test:
#   nix-build -E 'with import <nixpkgs> {}; callPackage ./nixos/tests/three-halls.nix { }'
# (or pkgs.testers.runNixOSTest). Each hall runs one etcd member and one
# arbiter; hallA also runs the controller and the tailer. The test takes a
# lock through each arbiter, then crashes hallC and shows that the two
# remaining halls (a quorum) still grant with a greater token.
# NOT RUN where this was written (no nixpkgs, no KVM): see nixos/README.md.
{
  pkgs,
  lib ? pkgs.lib,
  testers ? pkgs.testers,
}:
let
  halls = [
    "hallA"
    "hallB"
    "hallC"
  ];
  cluster = "entity-1";
  tls = "/etc/holdfast/tls";

  # A throwaway CA and certificates for the test (in the store: acceptable
  # for a VM test only; on real hosts keys never enter the store).
  certs = pkgs.runCommand "holdfast-three-halls-certs" { nativeBuildInputs = [ pkgs.openssl ]; } ''
    mkdir $out && cd $out
    gen() { # NAME SUBJECT EXT
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$1-key.pem" -out "$1.csr" -subj "/CN=$2"
      printf '%s\n' "$3" > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
        -days 30 -out "$1.pem" -extfile "$1.ext"
    }
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout ca-key.pem -out ca.pem -days 30 -subj /CN=holdfast-test-ca
    ${lib.concatMapStringsSep "\n" (h: ''
      gen etcd-${h} "holdfast etcd member" "subjectAltName=DNS:${h}
      extendedKeyUsage=serverAuth,clientAuth"
      gen arbiter-${h} ${h} "subjectAltName=DNS:${h}
      extendedKeyUsage=serverAuth"
    '') halls}
    for who in arbiter controller tailer root; do
      gen etcd-client-$who $who "extendedKeyUsage=clientAuth"
    done
    gen client client "subjectAltName=URI:spiffe://example.org/test/client
    extendedKeyUsage=clientAuth"
  '';

  etcdEndpoints = map (h: "https://${h}:2379") halls;

  # /etc/holdfast/tls as the packages lay it out, one user per daemon:
  # certificates 0644 root:root; a daemon's key 0640 root:<its group>; the
  # tailer's key (LoadCredential=) and the operator's 0600 root:root.
  tlsFile = mode: group: f: {
    name = "holdfast/tls/${f}";
    value = {
      source = "${certs}/${f}";
      inherit mode group;
      user = "root";
    };
  };
  cert = tlsFile "0644" "root";
  key = tlsFile "0640";
  rootKey = tlsFile "0600" "root";

  node =
    name:
    { config, ... }:
    {
      imports = [ ../default.nix ];
      virtualisation.memorySize = 1024;
      networking.firewall.allowedTCPPorts = [
        2379
        2380
      ];
      environment.etc = lib.listToAttrs [
        (cert "ca.pem")
        (cert "etcd-${name}.pem")
        (key "holdfast-etcd" "etcd-${name}-key.pem")
        (cert "arbiter-${name}.pem")
        (key "holdfast-arbiter" "arbiter-${name}-key.pem")
        (cert "etcd-client-arbiter.pem")
        (key "holdfast-arbiter" "etcd-client-arbiter-key.pem")
        # The operator's (holdfastctl in the test script, run as root).
        (cert "etcd-client-root.pem")
        (rootKey "etcd-client-root-key.pem")
        (cert "client.pem")
        (rootKey "client-key.pem")
      ];

      services.holdfast.etcd = {
        enable = true;
        inherit name;
        settings = {
          ETCD_INITIAL_CLUSTER = lib.concatMapStringsSep "," (h: "${h}=https://${h}:2380") halls;
          ETCD_INITIAL_CLUSTER_TOKEN = "${cluster}-three-halls";
          ETCD_INITIAL_CLUSTER_STATE = "new";
          ETCD_INITIAL_ADVERTISE_PEER_URLS = "https://${name}:2380";
          ETCD_LISTEN_PEER_URLS = "https://0.0.0.0:2380";
          ETCD_ADVERTISE_CLIENT_URLS = "https://${name}:2379";
          ETCD_LISTEN_CLIENT_URLS = "https://0.0.0.0:2379";
          ETCD_CERT_FILE = "${tls}/etcd-${name}.pem";
          ETCD_KEY_FILE = "${tls}/etcd-${name}-key.pem";
          ETCD_TRUSTED_CA_FILE = "${tls}/ca.pem";
          ETCD_PEER_CERT_FILE = "${tls}/etcd-${name}.pem";
          ETCD_PEER_KEY_FILE = "${tls}/etcd-${name}-key.pem";
          ETCD_PEER_TRUSTED_CA_FILE = "${tls}/ca.pem";
          ETCD_PEER_CERT_ALLOWED_CN = "holdfast etcd member";
        };
      };

      services.holdfast.arbiter = {
        enable = true;
        openFirewall = true;
        settings = {
          listen = "0.0.0.0:7420";
          metrics_listen = "127.0.0.1:7421";
          cluster_name = cluster;
          drain_timeout = "10s";
          tls = {
            cert_file = "${tls}/arbiter-${name}.pem";
            key_file = "${tls}/arbiter-${name}-key.pem";
            client_ca_file = "${tls}/ca.pem";
            trust_domain = "example.org";
          };
          etcd = {
            endpoints = etcdEndpoints;
            request_timeout = "5s";
            ca_file = "${tls}/ca.pem";
            cert_file = "${tls}/etcd-client-arbiter.pem";
            key_file = "${tls}/etcd-client-arbiter-key.pem";
          };
        };
      };
    };
in
testers.nixosTest {
  name = "holdfast-three-halls";

  nodes = {
    hallA = {
      imports = [ (node "hallA") ];
      environment.etc = lib.listToAttrs [
        (cert "etcd-client-controller.pem")
        (key "holdfast-controller" "etcd-client-controller-key.pem")
        (cert "etcd-client-tailer.pem")
        (rootKey "etcd-client-tailer-key.pem")
      ];
      services.holdfast.controller = {
        enable = true;
        classes.demo = {
          namespace = "demo";
          purpose = "correctness";
          enforcement = "advisory";
          risk_owner = "holdfast-test";
          waiver_expires = "2099-12-31";
          ttl = "30s";
          tier = "entity";
          on_quorum_loss = "closed";
        };
        settings = {
          metrics_listen = "127.0.0.1:7431";
          cluster_name = cluster;
          rescan_interval = "2s";
          etcd = {
            endpoints = etcdEndpoints;
            request_timeout = "5s";
            ca_file = "${tls}/ca.pem";
            cert_file = "${tls}/etcd-client-controller.pem";
            key_file = "${tls}/etcd-client-controller-key.pem";
          };
          election = {
            name = "/sys/election/controller";
            ttl = "10s";
          };
        };
      };
      services.holdfast.tailer = {
        enable = true;
        settings = {
          store_dir = "/var/lib/holdfast/audit";
          metrics_listen = "127.0.0.1:7432";
          cluster_name = cluster;
          checkpoint_interval = "2s";
          compaction_window = "1h";
          etcd = {
            endpoints = etcdEndpoints;
            request_timeout = "5s";
            ca_file = "${tls}/ca.pem";
            cert_file = "${tls}/etcd-client-tailer.pem";
            key_file = "${tls}/etcd-client-tailer-key.pem";
          };
          election = {
            name = "/sys/election/tailer";
            ttl = "5s";
          };
        };
      };
    };
    hallB = node "hallB";
    hallC = node "hallC";
  };

  testScript = ''
    tls = "${tls}"
    halls = [hallA, hallB, hallC]
    client = f"--ca {tls}/ca.pem --cert {tls}/client.pem --key {tls}/client-key.pem"
    etcd = (
        "--etcd-endpoint ${lib.concatStringsSep "," etcdEndpoints}"
        f" --etcd-ca {tls}/ca.pem --etcd-cert {tls}/etcd-client-root.pem"
        f" --etcd-key {tls}/etcd-client-root-key.pem"
    )

    start_all()
    # A new cluster is READY once a quorum of members is up.
    for m in halls:
        m.wait_for_unit(f"holdfast-etcd@{m.name}.service")

    hallA.succeed(f"holdfastctl epoch init {etcd}")
    hallA.wait_for_unit("holdfast-controller.service")
    hallA.wait_for_unit("holdfast-tailer.service")

    tokens = []
    for m in halls:
        m.wait_for_unit("holdfast-arbiter.service")
        m.wait_until_succeeds(f"holdfastctl health --endpoint {m.name}:7420 {client}", timeout=120)
        # The class set reaches every arbiter through etcd.
        out = m.wait_until_succeeds(
            f"holdfastctl lock exec --endpoint {m.name}:7420 {client} --wait 30s demo/ledger-7"
            " -- sh -c 'echo $HOLDFAST_TOKEN'",
            timeout=120,
        )
        tokens.append(int(out.strip().splitlines()[-1]))
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, f"tokens not increasing: {tokens}"

    # Lose one hall: two members of three keep the quorum.
    hallC.crash()
    out = hallA.wait_until_succeeds(
        f"holdfastctl lock exec --endpoint hallA:7420,hallB:7420 {client} --wait 30s demo/ledger-7"
        " -- sh -c 'echo $HOLDFAST_TOKEN'",
        timeout=120,
    )
    after = int(out.strip().splitlines()[-1])
    assert after > tokens[-1], f"token {after} after losing hallC is not greater than {tokens[-1]}"

    # The hardened units are what run.
    hallB.succeed("systemctl show holdfast-arbiter -p ProtectSystem | grep -qx ProtectSystem=strict")
    hallB.succeed("systemctl show holdfast-arbiter -p User | grep -qx User=holdfast-arbiter")

    # One user per daemon: each runs as its own, owns only its own state,
    # and reads no other daemon's key (nor the tailer its own: it gets it
    # through LoadCredential=).
    hallA.succeed("systemctl show holdfast-controller -p User | grep -qx User=holdfast-controller")
    hallA.succeed("systemctl show holdfast-tailer -p User | grep -qx User=holdfast-tailer")
    hallA.succeed("systemctl show holdfast-tailer -p Group | grep -qx Group=holdfast-audit")
    hallA.succeed("stat -c '%U:%G %a' /var/lib/holdfast/audit | grep -qx 'holdfast-tailer:holdfast-audit 750'")
    hallA.succeed("stat -c '%U:%G %a' /var/lib/holdfast/arbiter | grep -qx 'holdfast-arbiter:holdfast-arbiter 700'")
    hallA.succeed("""[ "$(stat -c '%U:%G %a' /etc/holdfast /etc/holdfast/tls | sort -u)" = 'root:root 711' ]""")
    hallA.succeed("runuser -u holdfast-controller -- cat /etc/holdfast/tls/etcd-client-controller-key.pem >/dev/null")
    for who, key in [
        ("holdfast-arbiter", "etcd-client-controller-key.pem"),
        ("holdfast-controller", "etcd-client-arbiter-key.pem"),
        ("holdfast-tailer", "etcd-client-tailer-key.pem"),
        ("holdfast-etcd", "etcd-client-arbiter-key.pem"),
    ]:
        hallA.fail(f"runuser -u {who} -- cat /etc/holdfast/tls/{key}")
  '';
}
