package holdfast_test

import (
	"context"
	"errors"
	"log"
	"time"

	holdfast "github.com/holdfast-dev/holdfast/clients/go"
)

// The README's example, compiled by `go test` (not run: it needs an arbiter).
func ExampleNewLocker() {
	ctx := context.Background()
	locker, err := holdfast.NewLocker(holdfast.Config{
		Endpoints: []string{"arb-1:7420", "arb-2:7420", "arb-3:7420"},
		CAFile:    "/etc/holdfast/tls/ca.pem", CertFile: "svid.pem", KeyFile: "svid-key.pem",
	}, func(f holdfast.Fenced) { /* required: stop acting on f.Keys NOW */ })
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)
	lock, err := locker.Acquire(ctx, holdfast.MustParseKey("payments/ledger-7"), holdfast.AcquireOptions{Wait: 30 * time.Second})
	if errors.Is(err, holdfast.ErrContention) {
		return // held elsewhere for 30 s
	} else if err != nil {
		log.Fatal(err)
	}
	for lock.CanStart() && lock.RemainingTTL() > 2*time.Second {
		writeWithFence(lock.Token().Expose()) // one unit of work
	}
	_, _ = lock.Release(ctx)
}

func writeWithFence(token uint64) {}
