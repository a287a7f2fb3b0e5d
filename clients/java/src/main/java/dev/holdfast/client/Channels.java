package dev.holdfast.client;

import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.ManagedChannel;
import io.grpc.TlsChannelCredentials;
import java.io.IOException;
import java.util.concurrent.TimeUnit;

/** Connections to arbiters: mTLS only, the arbiter's certificate checked against the endpoint's host. */
final class Channels {
    private Channels() {}

    /** An endpoint split into host (the TLS server name) and port. */
    record Target(String host, int port) {}

    static Target target(String endpoint) {
        String rest = endpoint;
        int scheme = endpoint.indexOf("://");
        if (scheme >= 0) {
            if (!endpoint.substring(0, scheme).equals("https")) {
                throw new HoldfastConfigException("endpoint \"" + endpoint
                        + "\": the arbiter speaks mTLS only; use host:port or https://host:port");
            }
            rest = endpoint.substring(scheme + 3);
        }
        int colon = rest.lastIndexOf(':');
        if (colon <= 0 || colon == rest.length() - 1) {
            throw new HoldfastConfigException("endpoint \"" + endpoint + "\": want host:port");
        }
        String host = rest.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        int port;
        try {
            port = Integer.parseInt(rest.substring(colon + 1));
        } catch (NumberFormatException e) {
            throw new HoldfastConfigException("endpoint \"" + endpoint + "\": want host:port", e);
        }
        if (port <= 0 || port > 65535) {
            throw new HoldfastConfigException("endpoint \"" + endpoint + "\": port out of range");
        }
        return new Target(host, port);
    }

    static ChannelCredentials credentials(Config cfg) {
        if (cfg.caFile() == null) {
            throw new HoldfastConfigException("no CA bundle (HOLDFAST_CA) configured");
        }
        if (cfg.certFile() == null || cfg.keyFile() == null) {
            throw new HoldfastConfigException("no client SVID (HOLDFAST_CERT and HOLDFAST_KEY) configured");
        }
        TlsChannelCredentials.Builder b = TlsChannelCredentials.newBuilder();
        try {
            b.trustManager(cfg.caFile().toFile());
        } catch (IOException | RuntimeException e) {
            throw new HoldfastConfigException("CA bundle " + cfg.caFile() + " (HOLDFAST_CA): " + e.getMessage(), e);
        }
        try {
            b.keyManager(new ReloadingKeyManager(cfg.certFile(), cfg.keyFile()));
        } catch (IOException | java.security.GeneralSecurityException | RuntimeException e) {
            throw new HoldfastConfigException("client SVID (HOLDFAST_CERT " + cfg.certFile() + ", HOLDFAST_KEY "
                    + cfg.keyFile() + "): " + e.getMessage(), e);
        }
        return b.build();
    }

    /** Connects (lazily) to endpoint. */
    static ManagedChannel open(String endpoint, ChannelCredentials creds) {
        Target t = target(endpoint);
        return Grpc.newChannelBuilderForAddress(t.host(), t.port(), creds)
                .keepAliveTime(10, TimeUnit.SECONDS)
                .keepAliveTimeout(5, TimeUnit.SECONDS)
                .keepAliveWithoutCalls(true)
                .build();
    }

    static void shutdown(ManagedChannel channel) {
        channel.shutdownNow();
        try {
            channel.awaitTermination(5, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
