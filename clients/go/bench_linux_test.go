package echomq_test

// BenchmarkConsume is the client's share of scripts/bench-peers, for
// profiling: entries like the peers benchmark's (fields `n` and a 100-byte
// `body`) appended to a fresh stream (not timed), then consumed through the
// fixture's sidecar with MaxInFlight 1024 and a no-op handler until every
// entry was handled. It reports this process's CPU per entry (getrusage),
// which is what the client costs (the sidecar and Redis are other processes):
//
//	ECHOMQ_SIDECAR_BIN=/path/to/release/echomq-sidecar ECHOMQ_BENCH_CPUPROFILE=cpu.out \
//	  go test -run '^$' -bench Consume -benchtime 5x
//	go tool pprof -top cpu.out
//
// ECHOMQ_BENCH_CPUPROFILE profiles only the consuming (go test's -cpuprofile
// would include the appends); ECHOMQ_BENCH_MEMPROFILE writes the heap
// profile after it (allocations since the start, see -sample_index).

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// benchEntries is how many entries one iteration consumes.
const benchEntries = 50_000

func BenchmarkConsume(b *testing.B) {
	cl := fixture(b)
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	producer := echomq.NewStreams(conn)
	body := []byte(strings.Repeat("x", 100))
	b.StopTimer()
	streams := make([]string, b.N)
	for n := range streams {
		stream := uniqueStream("go:bench")
		streams[n] = stream
		for first := 0; first < benchEntries; first += 1000 {
			batch := make([]map[string][]byte, 0, 1000)
			for i := first; i < min(first+1000, benchEntries); i++ {
				batch = append(batch, map[string][]byte{"n": []byte(strconv.Itoa(i)), "body": body})
			}
			if _, err := producer.AppendBatch(context.Background(), stream, batch); err != nil {
				b.Fatal(err)
			}
		}
	}
	if path := os.Getenv("ECHOMQ_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if path := os.Getenv("ECHOMQ_BENCH_MEMPROFILE"); path != "" {
		runtime.MemProfileRate = 64 << 10
		defer func() {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
		}()
	}
	var cpu, wall time.Duration
	for _, stream := range streams {
		consumer := echomq.NewConsumer(echomq.ConsumerConfig{
			Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(), MaxInFlight: 1024,
		})
		var seen atomic.Int64
		all := make(chan struct{})
		done := make(chan error, 1)
		cpu0, wall0 := processCPU(), time.Now()
		b.StartTimer()
		go func() {
			done <- consumer.Run(context.Background(), func(context.Context, *echomq.Delivery) error {
				if seen.Add(1) == benchEntries {
					close(all)
				}
				return nil
			})
		}()
		select {
		case <-all:
		case err := <-done:
			b.Fatalf("the consumer stopped early: %v", err)
		}
		if err := waitFor(30*time.Second, func() bool { return pendingCount(cl.redisAddr, stream) == 0 }); err != nil {
			b.Fatalf("XPENDING %d", pendingCount(cl.redisAddr, stream))
		}
		b.StopTimer()
		cpu += processCPU() - cpu0
		wall += time.Since(wall0)
		if err := consumer.Stop(context.Background()); err != nil {
			b.Fatal(err)
		}
		<-done
		_, _ = redisDo(cl.redisAddr, "DEL", stream)
	}
	entries := float64(b.N * benchEntries)
	b.ReportMetric(float64(cpu.Microseconds())/entries, "cpu-µs/entry")
	b.ReportMetric(entries/wall.Seconds(), "entries/s")
	b.ReportMetric(0, "ns/op")
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
