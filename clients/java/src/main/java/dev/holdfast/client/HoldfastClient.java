package dev.holdfast.client;

import io.grpc.ManagedChannel;
import java.util.concurrent.TimeUnit;
import lock.v1.LockGrpc;
import lock.v1.LockOuterClass.InspectRequest;
import lock.v1.LockOuterClass.InspectResponse;
import lock.v1.LockOuterClass.ServerStatusRequest;
import lock.v1.LockOuterClass.ServerStatusResponse;
import lock.v1.LockOuterClass.ValidateTokenRequest;

/**
 * A connection to one arbiter, for the calls a {@link Locker} does not make
 * (Inspect, ServerStatus, ValidateToken) and for raw lock.v1 calls. Most
 * workloads need only a Locker.
 */
public final class HoldfastClient implements AutoCloseable {
    private final ManagedChannel channel;
    private final Config config;

    /**
     * Connects (lazily) to one arbiter with cfg's mTLS material
     * (cfg's endpoints are ignored).
     *
     * @param endpoint {@code host:port} or {@code https://host:port}
     * @param cfg the mTLS material and call timeout
     */
    public HoldfastClient(String endpoint, Config cfg) {
        this.channel = Channels.open(endpoint, Channels.credentials(cfg));
        this.config = cfg;
    }

    /**
     * The generated blocking stub on this connection. Its errors are raw gRPC
     * statuses: pass them through {@link HoldfastException#from} for the
     * typed reason.
     *
     * @return the stub
     */
    public LockGrpc.LockBlockingStub rpc() {
        return LockGrpc.newBlockingStub(channel);
    }

    private LockGrpc.LockBlockingStub timed() {
        return rpc().withDeadlineAfter(config.callTimeout().toNanos(), TimeUnit.NANOSECONDS);
    }

    /**
     * Who holds key (never the token).
     *
     * @param key the key
     * @return the arbiter's answer
     */
    public InspectResponse inspect(Key key) {
        try {
            return timed().inspect(InspectRequest.newBuilder().setNamespace(key.namespace()).setKey(key.path()).build());
        } catch (RuntimeException e) {
            throw HoldfastException.from(e);
        }
    }

    /** @return what the arbiter serves (epoch, sealed or not, …) */
    public ServerStatusResponse serverStatus() {
        try {
            return timed().serverStatus(ServerStatusRequest.getDefaultInstance());
        } catch (RuntimeException e) {
            throw HoldfastException.from(e);
        }
    }

    /**
     * Whether token is the token of the hold on key now, for resources that
     * cannot store a fence mark (rate-limited by the arbiter).
     *
     * @param key the key
     * @param token the token presented
     * @return true when it is the current hold's token
     */
    public boolean validateToken(Key key, Token token) {
        try {
            return timed().validateToken(ValidateTokenRequest.newBuilder()
                            .setNamespace(key.namespace())
                            .setKey(key.path())
                            .setToken(token.expose())
                            .build())
                    .getValid();
        } catch (RuntimeException e) {
            throw HoldfastException.from(e);
        }
    }

    /** Closes the connection. */
    @Override
    public void close() {
        Channels.shutdown(channel);
    }
}
