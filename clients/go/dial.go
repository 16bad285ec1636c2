package echomq

import (
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// MaxMessageBytes is the largest gRPC message [Dial] lets a call send or
// receive (64 MiB): an entry is one message, and grpc-go's default of 4 MiB
// would refuse entries the sidecar accepts.
const MaxMessageBytes = 64 << 20

// Dial returns a connection to the sidecar at target: `host:port` (TCP), or
// `unix:/path/to/socket`, the same forms as the sidecar's `--listen` flag
// (ECHOMQ_LISTEN).
//
// The connection is lazy: Dial fails only on a malformed target, and the first
// call connects. It is plaintext, because the sidecar is pod-local; pass
// [grpc.WithTransportCredentials] in opts for TLS (later options win). The
// transport reconnects after at most 2 s of backoff, so that a restarted
// sidecar is found quickly; the [Consumer]'s own reconnect backoff paces the
// calls on top of it.
//
// One connection can serve a [Producer] and any number of consumers. Close it
// when done.
func Dial(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if !strings.HasPrefix(target, "unix:") {
		// The sidecar is an address, not a name to resolve and balance over.
		target = "passthrough:///" + target
	}
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   2 * time.Second,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
	}
	return grpc.NewClient(target, append(base, opts...)...)
}
