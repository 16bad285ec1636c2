// Command peers is the Go half of scripts/bench-peers: it appends the entries
// and runs the Go contenders, each consuming one stream through its own group
// from the group's creation until Redis has every entry acknowledged.
//
//	peers append   -sidecar ADDR -streams s1,s2 -n N   AppendBatch, 1000 per call
//	peers goredis  -redis ADDR -stream S -group G -n N  XREADGROUP COUNT 256 + one XACK per read
//	peers watermill -redis ADDR -stream S -group G -n N Watermill's redisstream subscriber, its defaults
//	peers echomq   -sidecar ADDR -stream S -group G -n N our Go client through the sidecar
//
// A contender prints one line, `RESULT <name> <seconds> <client cpu s>
// <sidecar cpu s> <redis cpu s>`: the timed window, this process's CPU time in
// it (getrusage), and the CPU time the sidecar and Redis spent in it (from
// /proc/PID/stat of $PEERS_SIDECAR_PID and $PEERS_REDIS_PID).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	echomq "github.com/echomq/echomq-sidecar/clients/go"
	"github.com/redis/go-redis/v9"
)

// bodyBytes is the size of each entry's `body` field.
const bodyBytes = 100

// appendBatch is how many entries one AppendBatch call carries.
const appendBatch = 1000

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: peers append|goredis|watermill|echomq [flags]"))
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	redisAddr := fs.String("redis", "", "redis host:port")
	sidecar := fs.String("sidecar", "", "sidecar host:port")
	stream := fs.String("stream", "", "stream key")
	streams := fs.String("streams", "", "comma-separated stream keys (append)")
	group := fs.String("group", "", "consumer group")
	n := fs.Int("n", 100_000, "entries")
	maxInFlight := fs.Uint("max-in-flight", 0, "echomq: MaxInFlight (0: the client's default, the adaptive window)")
	_ = fs.Parse(os.Args[2:])
	ctx := context.Background()
	var err error
	switch cmd {
	case "append":
		err = appendEntries(ctx, *sidecar, strings.Split(*streams, ","), *n)
	case "goredis":
		err = timed("go-redis", *redisAddr, *stream, *group, *n, func(rdb *redis.Client) error {
			return goRedis(ctx, rdb, *stream, *group, *n)
		})
	case "watermill":
		err = timed("watermill", *redisAddr, *stream, *group, *n, func(rdb *redis.Client) error {
			return watermillSub(ctx, rdb, *stream, *group, *n)
		})
	case "echomq":
		name := "echomq-go"
		if *maxInFlight != 0 {
			name = fmt.Sprintf("echomq-go-%d", *maxInFlight)
		}
		err = timed(name, *redisAddr, *stream, *group, *n, func(rdb *redis.Client) error {
			return echomqGo(ctx, *sidecar, *stream, *group, *n, uint32(*maxInFlight))
		})
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "peers:", err)
	os.Exit(1)
}

// appendEntries appends n entries to each stream through the sidecar's
// AppendBatch: fields `n` and a 100-byte `body` (the sidecar adds the branded
// `id`), the same entries every contender reads.
func appendEntries(ctx context.Context, sidecar string, streams []string, n int) error {
	conn, err := echomq.Dial(sidecar)
	if err != nil {
		return err
	}
	defer conn.Close()
	producer := echomq.NewStreams(conn)
	body := []byte(strings.Repeat("x", bodyBytes))
	for _, stream := range streams {
		for first := 0; first < n; first += appendBatch {
			last := min(first+appendBatch, n)
			batch := make([]map[string][]byte, 0, last-first)
			for i := first; i < last; i++ {
				batch = append(batch, map[string][]byte{"n": []byte(strconv.Itoa(i)), "body": body})
			}
			if _, err := producer.AppendBatch(ctx, stream, batch); err != nil {
				return fmt.Errorf("append to %s: %w", stream, err)
			}
		}
	}
	return nil
}

// timed runs one contender and prints its RESULT line. The window opens just
// before the contender creates its group (or subscribes) and closes when
// XPENDING says nothing is pending and every entry was handled.
func timed(name, redisAddr, stream, group string, n int, run func(*redis.Client) error) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ReadTimeout: -1})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return err
	}
	sidecarPid, redisPid := os.Getenv("PEERS_SIDECAR_PID"), os.Getenv("PEERS_REDIS_PID")
	sidecar0, redis0, self0 := procCPU(sidecarPid), procCPU(redisPid), selfCPU()
	started := time.Now()
	if err := run(rdb); err != nil {
		return err
	}
	if err := waitNonePending(ctx, rdb, stream, group); err != nil {
		return err
	}
	took := time.Since(started)
	self1, sidecar1, redis1 := selfCPU(), procCPU(sidecarPid), procCPU(redisPid)
	fmt.Printf("RESULT %s %.6f %.3f %.3f %.3f\n", name, took.Seconds(), self1-self0, sidecar1-sidecar0, redis1-redis0)
	if stopAfter != nil {
		stopAfter()
	}
	return nil
}

// waitNonePending polls XPENDING until the group has nothing pending.
func waitNonePending(ctx context.Context, rdb *redis.Client, stream, group string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := rdb.XPending(ctx, stream, group).Result()
		if err != nil {
			return err
		}
		if p.Count == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s/%s: %d entries still pending", stream, group, p.Count)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// goRedis: XREADGROUP COUNT 256 BLOCK 2000, then one XACK with every id of the read.
func goRedis(ctx context.Context, rdb *redis.Client, stream, group string, n int) error {
	if err := rdb.XGroupCreate(ctx, stream, group, "0").Err(); err != nil {
		return err
	}
	ids := make([]string, 0, 256)
	for seen := 0; seen < n; {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: "c1", Streams: []string{stream, ">"}, Count: 256, Block: 2 * time.Second,
		}).Result()
		if err != nil {
			return fmt.Errorf("XREADGROUP: %w", err)
		}
		for _, s := range res {
			ids = ids[:0]
			for _, m := range s.Messages {
				ids = append(ids, m.ID) // the handler: nothing to do
			}
			if len(ids) > 0 {
				if err := rdb.XAck(ctx, stream, group, ids...).Err(); err != nil {
					return err
				}
			}
			seen += len(ids)
		}
	}
	return nil
}

// idBodyUnmarshaller reads the entries the benchmark appends (branded `id`,
// `body`): Watermill's default unmarshaller needs its own
// `_watermill_message_uuid` field, which entries not written by Watermill lack.
type idBodyUnmarshaller struct{}

func (idBodyUnmarshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	id, _ := values["id"].(string)
	body, _ := values["body"].(string)
	return message.NewMessage(id, []byte(body)), nil
}

// watermillSub: Watermill's redisstream subscriber with its defaults (one
// entry per XREADGROUP, one XACK per message); the handler acks each message.
func watermillSub(ctx context.Context, rdb *redis.Client, stream, group string, n int) error {
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        rdb,
		ConsumerGroup: group,
		Unmarshaller:  idBodyUnmarshaller{},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	// Its acks are sent by its own goroutines: close it after the window.
	stopAfter = func() {
		cancel()
		_ = sub.Close()
	}
	messages, err := sub.Subscribe(ctx, stream)
	if err != nil {
		return err
	}
	for seen := 0; seen < n; seen++ {
		msg, ok := <-messages
		if !ok {
			return errors.New("watermill closed the subscription early")
		}
		msg.Ack()
	}
	return nil
}

// echomqGo: our Go client through the sidecar with its defaults (MaxInFlight
// unset: the sidecar's adaptive window, 64 handler goroutines, batched frames,
// coalesced acks), or with MaxInFlight fixed when maxInFlight is not 0; a
// handler that returns nil.
func echomqGo(ctx context.Context, sidecar, stream, group string, n int, maxInFlight uint32) error {
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Target: sidecar, Stream: stream, Group: group, Start: echomq.StartBeginning(), FlowControl: echomq.FlowControl{MaxInFlight: maxInFlight},
	})
	var seen atomic.Int64
	all := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- consumer.Run(ctx, func(context.Context, *echomq.Delivery) error {
			if seen.Add(1) == int64(n) {
				close(all)
			}
			return nil
		})
	}()
	select {
	case <-all:
	case err := <-done:
		return fmt.Errorf("the consumer stopped early: %v", err)
	}
	// The acks of the last window go out within AckLinger; the caller's
	// XPENDING poll waits for them. Stop after the window closes.
	stopAfter = func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = consumer.Stop(stopCtx)
		<-done
	}
	return nil
}

// stopAfter, when set, is run after the timed window (stopping a consumer is
// not part of what is timed).
var stopAfter func()

// selfCPU is this process's user+system CPU seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// procCPU is a process's user+system CPU seconds from /proc/PID/stat
// (utime and stime, in clock ticks of $PEERS_CLK_TCK, default 100).
func procCPU(pid string) float64 {
	if pid == "" {
		return 0
	}
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// The command name is in parentheses and may hold spaces: split after it.
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	tck := 100.0
	if v, err := strconv.ParseFloat(os.Getenv("PEERS_CLK_TCK"), 64); err == nil && v > 0 {
		tck = v
	}
	return (utime + stime) / tck
}
