package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The client SVID is read again when its files change, and a pair that does not load is never used. */
class ReloadingKeyManagerTest {
    @TempDir
    Path dir;

    /** A self-signed P-256 certificate with CN=cn and its PKCS#8 key, by openssl. */
    private Path[] issue(String cn) throws Exception {
        Path cert = dir.resolve(cn + ".pem");
        Path key = dir.resolve(cn + "-key.pem");
        Process p = new ProcessBuilder("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-days", "1", "-subj", "/CN=" + cn, "-keyout", key.toString(), "-out", cert.toString())
                .redirectErrorStream(true)
                .start();
        String out = new String(p.getInputStream().readAllBytes());
        assertTrue(p.waitFor(30, TimeUnit.SECONDS) && p.exitValue() == 0, "openssl: " + out);
        return new Path[] {cert, key};
    }

    private static String presented(ReloadingKeyManager m) {
        String alias = m.chooseEngineClientAlias(new String[] {"EC"}, null, null);
        return m.getCertificateChain(alias)[0].getSubjectX500Principal().getName();
    }

    /** Writes src over dst by rename, as a rotation should. */
    private static void rotate(Path src, Path dst) throws Exception {
        Path tmp = dst.resolveSibling(dst.getFileName() + ".new");
        Files.copy(src, tmp, StandardCopyOption.REPLACE_EXISTING);
        Files.move(tmp, dst, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    }

    /** A manager over cert.pem and key.pem, holding svid-a's pair. */
    private ReloadingKeyManager managerOfA() throws Exception {
        Path[] a = issue("svid-a");
        rotate(a[0], dir.resolve("cert.pem"));
        rotate(a[1], dir.resolve("key.pem"));
        return new ReloadingKeyManager(dir.resolve("cert.pem"), dir.resolve("key.pem"));
    }

    @Test
    void aRotatedSvidIsWhatTheNextHandshakePresents() throws Exception {
        ReloadingKeyManager m = managerOfA();
        assertEquals("CN=svid-a", presented(m));
        Path[] b = issue("svid-b");
        rotate(b[0], dir.resolve("cert.pem"));
        rotate(b[1], dir.resolve("key.pem"));
        assertEquals("CN=svid-b", presented(m));
    }

    @Test
    void aHalfRotatedPairKeepsTheLastGoodOne() throws Exception {
        ReloadingKeyManager m = managerOfA();
        Path[] b = issue("svid-b");
        // The new certificate lands before its key: not a pair, never presented.
        rotate(b[0], dir.resolve("cert.pem"));
        assertEquals("CN=svid-a", presented(m));
        rotate(b[1], dir.resolve("key.pem"));
        assertEquals("CN=svid-b", presented(m));
    }

    @Test
    void anUnreadablePairIsRefusedAtConstruction() throws Exception {
        Path junk = dir.resolve("junk.pem");
        Files.writeString(junk, "not a certificate\n");
        assertThrows(Exception.class, () -> new ReloadingKeyManager(junk, junk));
    }
}
