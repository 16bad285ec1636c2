package echomq

import (
	"math/rand/v2"
	"time"
)

// Default reconnect backoff of a [Consumer]: 100 ms, doubled per failed
// attempt, capped at 5 s.
const (
	DefaultReconnectInitial = 100 * time.Millisecond
	DefaultReconnectMax     = 5 * time.Second
)

// Backoff is the jittered exponential delay between attempts to (re)open the
// Consume call. The n-th consecutive failure waits a random duration in the
// upper half of min(Max, Initial·2ⁿ), so that many consumers of a restarted
// sidecar do not come back in lockstep. A successful subscribe resets it.
type Backoff struct {
	// Initial is the first delay's ceiling. Zero: [DefaultReconnectInitial].
	Initial time.Duration
	// Max caps the delay. Zero: [DefaultReconnectMax].
	Max time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = DefaultReconnectInitial
	}
	if b.Max <= 0 {
		b.Max = DefaultReconnectMax
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	return b
}

// Delay is the wait after the attempt-th consecutive failure (0 for the first).
func (b Backoff) Delay(attempt int) time.Duration {
	b = b.withDefaults()
	ceiling := b.Max
	if attempt < 32 {
		if d := b.Initial << attempt; d > 0 && d < b.Max {
			ceiling = d
		}
	}
	half := ceiling / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}
