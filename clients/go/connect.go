package holdfast

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

// Config says where the arbiters are and holds this workload's mTLS
// material: its X.509 SVID (a certificate whose one spiffe:// URI SAN is the
// caller's identity), its key, and the CA bundle that signed the arbiters'
// certificates.
type Config struct {
	// Every arbiter, "host:port" or "https://host:port". The order does not
	// matter: all clients with the same set route each key to the same one.
	Endpoints []string
	// CA bundle (PEM) that signed the arbiters' certificates.
	CAFile string
	// This workload's certificate (PEM chain) and private key. Read again at
	// every new connection, so a rotated SVID is used without a new Locker.
	CertFile string
	KeyFile  string
}

// ConfigFromEnv reads HOLDFAST_ENDPOINT (one endpoint, or several separated
// by commas), HOLDFAST_CA, HOLDFAST_CERT and HOLDFAST_KEY, as the Rust
// client and holdfastctl do.
func ConfigFromEnv() (Config, error) {
	var missing []string
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	}
	c := Config{CAFile: get("HOLDFAST_CA"), CertFile: get("HOLDFAST_CERT"), KeyFile: get("HOLDFAST_KEY")}
	for _, e := range strings.Split(get("HOLDFAST_ENDPOINT"), ",") {
		if e = strings.TrimSpace(e); e != "" {
			c.Endpoints = append(c.Endpoints, e)
		}
	}
	if len(missing) > 0 {
		return Config{}, configError("%s not set; `source DIR/env` from `holdfastctl dev`, or set them", strings.Join(missing, ", "))
	}
	return c, nil
}

// target splits an endpoint into the dial target and the TLS server name
// (the host, checked against the arbiter certificate's DNS or IP SANs).
func target(endpoint string) (addr, host string, err error) {
	rest := endpoint
	if scheme, r, ok := strings.Cut(endpoint, "://"); ok {
		if scheme != "https" {
			return "", "", configError("endpoint %q: the arbiter speaks mTLS only; use host:port or https://host:port", endpoint)
		}
		rest = r
	}
	i := strings.LastIndex(rest, ":")
	if i <= 0 || i == len(rest)-1 {
		return "", "", configError("endpoint %q: want host:port", endpoint)
	}
	host = strings.Trim(rest[:i], "[]")
	return rest, host, nil
}

func (c Config) tls(host string) (*tls.Config, error) {
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, configError("CA bundle (HOLDFAST_CA): %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, configError("CA bundle %s (HOLDFAST_CA) holds no PEM certificate", c.CAFile)
	}
	load := func() (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, configError("client SVID (HOLDFAST_CERT %s, HOLDFAST_KEY %s): %v", c.CertFile, c.KeyFile, err)
		}
		return &cert, nil
	}
	// Refuse unreadable files now rather than at the first call.
	if _, err := load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    roots,
		ServerName: host,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return load()
		},
	}, nil
}

func dial(endpoint string, cfg Config, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	addr, host, err := target(endpoint)
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	}
	if len(extra) == 0 {
		t, err := cfg.tls(host)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(t)))
	}
	opts = append(opts, extra...)
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, configError("endpoint %q: %v", endpoint, err)
	}
	return conn, nil
}

// Client is a connection to one arbiter, for the calls a Locker does not
// make (Inspect, ServerStatus, ValidateToken) and for raw lockv1 calls.
// Most workloads need only a Locker.
type Client struct {
	conn *grpc.ClientConn
	rpc  lockv1.LockClient
}

// NewClient connects (lazily) to one arbiter with cfg's mTLS material
// (cfg.Endpoints is ignored).
func NewClient(endpoint string, cfg Config) (*Client, error) {
	conn, err := dial(endpoint, cfg, nil)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, rpc: lockv1.NewLockClient(conn)}, nil
}

// RPC is the generated client on this connection. Its errors are raw gRPC
// statuses: pass them through FromError for the typed reason.
func (c *Client) RPC() lockv1.LockClient { return c.rpc }

// Inspect says who holds key (never the token).
func (c *Client) Inspect(ctx context.Context, key Key) (*lockv1.InspectResponse, error) {
	r, err := c.rpc.Inspect(ctx, &lockv1.InspectRequest{Namespace: key.Namespace(), Key: key.Path()})
	return r, FromError(err)
}

// ServerStatus says what the arbiter serves (epoch, sealed or not, …).
func (c *Client) ServerStatus(ctx context.Context) (*lockv1.ServerStatusResponse, error) {
	r, err := c.rpc.ServerStatus(ctx, &lockv1.ServerStatusRequest{})
	return r, FromError(err)
}

// ValidateToken says whether token is the token of the hold on key now, for
// resources that cannot store a fence mark (rate-limited by the arbiter).
func (c *Client) ValidateToken(ctx context.Context, key Key, token Token) (bool, error) {
	r, err := c.rpc.ValidateToken(ctx, &lockv1.ValidateTokenRequest{Namespace: key.Namespace(), Key: key.Path(), Token: token.Expose()})
	if err != nil {
		return false, FromError(err)
	}
	return r.GetValid(), nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }
