package dev.holdfast.client;

import io.grpc.util.AdvancedTlsX509KeyManager;
import java.io.IOException;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.security.GeneralSecurityException;
import java.security.Principal;
import java.security.PrivateKey;
import java.security.SecureRandom;
import java.security.Signature;
import java.security.cert.X509Certificate;
import java.util.logging.Level;
import java.util.logging.Logger;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.X509ExtendedKeyManager;

/**
 * The client SVID, read again from its files at every TLS handshake whose
 * files changed since the last read, so that a certificate rotated on disk
 * (an hour-long SPIFFE SVID) is what the next connection presents, as the Go
 * and Rust clients do. Files that do not load (a new certificate next to
 * the old key, mid-rotation) are logged and the last good pair stays in use.
 * Parsing is grpc-java's ({@link AdvancedTlsX509KeyManager}: PEM chain,
 * PKCS#8 key).
 */
final class ReloadingKeyManager extends X509ExtendedKeyManager {
    private static final Logger LOG = Logger.getLogger(ReloadingKeyManager.class.getName());

    private final AdvancedTlsX509KeyManager current = new AdvancedTlsX509KeyManager();
    private final Path cert;
    private final Path key;
    private String stamp;

    /** Reads the pair once; throws if it does not load. */
    ReloadingKeyManager(Path cert, Path key) throws IOException, GeneralSecurityException {
        this.cert = cert;
        this.key = key;
        this.stamp = stamp();
        load();
    }

    /**
     * Reads the pair into the manager in use, only if the key is the
     * certificate's (a signature made with it verifies with the
     * certificate's public key).
     */
    private void load() throws IOException, GeneralSecurityException {
        AdvancedTlsX509KeyManager next = new AdvancedTlsX509KeyManager();
        next.updateIdentityCredentials(cert.toFile(), key.toFile());
        String alias = next.chooseEngineClientAlias(new String[] {"EC", "RSA", "EdDSA"}, null, null);
        X509Certificate[] chain = next.getCertificateChain(alias);
        PrivateKey pk = next.getPrivateKey(alias);
        if (chain == null || chain.length == 0 || pk == null) {
            throw new GeneralSecurityException("no certificate and key in the files");
        }
        String algorithm = switch (pk.getAlgorithm()) {
            case "EC" -> "SHA256withECDSA";
            case "RSA" -> "SHA256withRSA";
            default -> pk.getAlgorithm();
        };
        byte[] probe = new byte[32];
        new SecureRandom().nextBytes(probe);
        Signature sign = Signature.getInstance(algorithm);
        sign.initSign(pk);
        sign.update(probe);
        byte[] signed = sign.sign();
        Signature verify = Signature.getInstance(algorithm);
        verify.initVerify(chain[0].getPublicKey());
        verify.update(probe);
        if (!verify.verify(signed)) {
            throw new GeneralSecurityException("the key is not the certificate's (" + chain[0].getSubjectX500Principal() + ")");
        }
        current.updateIdentityCredentials(chain, pk);
    }

    /** The files' modification times and sizes: what "changed" compares. */
    private String stamp() throws IOException {
        StringBuilder b = new StringBuilder();
        for (Path p : new Path[] {cert, key}) {
            BasicFileAttributes a = Files.readAttributes(p, BasicFileAttributes.class);
            b.append(a.lastModifiedTime().toMillis()).append('/').append(a.size()).append('/').append(a.fileKey()).append(';');
        }
        return b.toString();
    }

    private synchronized void reloadIfChanged() {
        try {
            String now = stamp();
            if (now.equals(stamp)) {
                return;
            }
            load();
            stamp = now;
        } catch (IOException | GeneralSecurityException | RuntimeException e) {
            LOG.log(Level.WARNING, "holdfast: the client SVID (" + cert + ", " + key
                    + ") did not load; the last good one stays in use: " + e.getMessage());
        }
    }

    @Override
    public String chooseClientAlias(String[] keyType, Principal[] issuers, Socket socket) {
        reloadIfChanged();
        return current.chooseClientAlias(keyType, issuers, socket);
    }

    @Override
    public String chooseEngineClientAlias(String[] keyType, Principal[] issuers, SSLEngine engine) {
        reloadIfChanged();
        return current.chooseEngineClientAlias(keyType, issuers, engine);
    }

    @Override
    public String[] getClientAliases(String keyType, Principal[] issuers) {
        return current.getClientAliases(keyType, issuers);
    }

    @Override
    public X509Certificate[] getCertificateChain(String alias) {
        return current.getCertificateChain(alias);
    }

    @Override
    public PrivateKey getPrivateKey(String alias) {
        return current.getPrivateKey(alias);
    }

    @Override
    public String[] getServerAliases(String keyType, Principal[] issuers) {
        return null;
    }

    @Override
    public String chooseServerAlias(String keyType, Principal[] issuers, Socket socket) {
        return null;
    }

    @Override
    public String chooseEngineServerAlias(String keyType, Principal[] issuers, SSLEngine engine) {
        return null;
    }
}
