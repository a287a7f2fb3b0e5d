package dev.holdfast.client;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Where the arbiters are and this workload's mTLS material: its X.509 SVID (a
 * certificate whose one spiffe:// URI SAN is the caller's identity), its
 * private key, and the CA bundle that signed the arbiters' certificates, all
 * PEM files. Build one with {@link #builder()} or {@link #fromEnv()}.
 */
public final class Config {
    private final List<String> endpoints;
    private final Path caFile;
    private final Path certFile;
    private final Path keyFile;
    private final Duration callTimeout;

    private Config(Builder b) {
        this.endpoints = List.copyOf(b.endpoints);
        this.caFile = b.caFile;
        this.certFile = b.certFile;
        this.keyFile = b.keyFile;
        this.callTimeout = b.callTimeout;
    }

    /** @return a builder with no endpoint and a call timeout of 30 s */
    public static Builder builder() {
        return new Builder();
    }

    /**
     * Reads HOLDFAST_ENDPOINT (one endpoint, or several separated by commas),
     * HOLDFAST_CA, HOLDFAST_CERT and HOLDFAST_KEY, as the Rust client and
     * holdfastctl do.
     *
     * @return the configuration
     * @throws HoldfastConfigException naming every variable that is not set
     */
    public static Config fromEnv() {
        return fromEnv(System.getenv());
    }

    static Config fromEnv(Map<String, String> env) {
        List<String> missing = new ArrayList<>();
        String[] values = new String[4];
        String[] names = {"HOLDFAST_CA", "HOLDFAST_CERT", "HOLDFAST_KEY", "HOLDFAST_ENDPOINT"};
        for (int i = 0; i < names.length; i++) {
            values[i] = env.getOrDefault(names[i], "");
            if (values[i].isEmpty()) {
                missing.add(names[i]);
            }
        }
        if (!missing.isEmpty()) {
            throw new HoldfastConfigException(
                    String.join(", ", missing) + " not set; `source DIR/env` from `holdfastctl dev`, or set them");
        }
        Builder b = builder().caFile(Path.of(values[0])).certFile(Path.of(values[1])).keyFile(Path.of(values[2]));
        for (String e : values[3].split(",")) {
            if (!e.isBlank()) {
                b.endpoint(e.strip());
            }
        }
        return b.build();
    }

    /** @return every arbiter endpoint, in the configured order */
    public List<String> endpoints() {
        return endpoints;
    }

    /** @return the CA bundle (PEM) that signed the arbiters' certificates */
    public Path caFile() {
        return caFile;
    }

    /** @return this workload's certificate chain (PEM) */
    public Path certFile() {
        return certFile;
    }

    /** @return this workload's private key (PEM, PKCS#8) */
    public Path keyFile() {
        return keyFile;
    }

    /** @return how long one call may take, besides an acquire's wait */
    public Duration callTimeout() {
        return callTimeout;
    }

    /** @return a builder holding this configuration */
    public Builder toBuilder() {
        Builder b = new Builder();
        b.endpoints.addAll(endpoints);
        b.caFile = caFile;
        b.certFile = certFile;
        b.keyFile = keyFile;
        b.callTimeout = callTimeout;
        return b;
    }

    @Override
    public String toString() {
        return "Config{endpoints=" + endpoints + ", ca=" + caFile + ", cert=" + certFile + ", key=" + keyFile + "}";
    }

    /** Builds a {@link Config}. */
    public static final class Builder {
        private final List<String> endpoints = new ArrayList<>();
        private Path caFile;
        private Path certFile;
        private Path keyFile;
        private Duration callTimeout = Duration.ofSeconds(30);

        private Builder() {}

        /**
         * Adds an arbiter, {@code host:port} or {@code https://host:port}. The
         * order does not matter: all clients with the same set route each key
         * to the same arbiter.
         *
         * @param endpoint the endpoint
         * @return this builder
         */
        public Builder endpoint(String endpoint) {
            endpoints.add(endpoint);
            return this;
        }

        /**
         * Replaces the endpoints.
         *
         * @param all every arbiter
         * @return this builder
         */
        public Builder endpoints(List<String> all) {
            endpoints.clear();
            endpoints.addAll(all);
            return this;
        }

        /**
         * @param path the CA bundle (PEM) that signed the arbiters' certificates
         * @return this builder
         */
        public Builder caFile(Path path) {
            this.caFile = path;
            return this;
        }

        /**
         * @param path this workload's certificate chain (PEM)
         * @return this builder
         */
        public Builder certFile(Path path) {
            this.certFile = path;
            return this;
        }

        /**
         * @param path this workload's private key (PEM, PKCS#8 as rustls
         *     and holdfastctl write it)
         * @return this builder
         */
        public Builder keyFile(Path path) {
            this.keyFile = path;
            return this;
        }

        /**
         * @param timeout how long one call may take, besides an acquire's wait
         * @return this builder
         */
        public Builder callTimeout(Duration timeout) {
            this.callTimeout = timeout;
            return this;
        }

        /** @return the configuration */
        public Config build() {
            return new Config(this);
        }
    }
}
