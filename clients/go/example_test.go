package echomq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/status"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// The README's opening example, kept compiling here (scripts/test-examples
// runs the README's own copy against a sidecar, Ctrl-C included).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Target: "127.0.0.1:50051", Stream: "orders", Group: "billing", Start: echomq.StartBeginning()})
	go func() { // Ctrl-C or SIGTERM: no new deliveries; running handlers get 10 s to finish
		<-ctx.Done()
		deadline, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = consumer.Stop(deadline)
	}()
	handle := func(ctx context.Context, d *echomq.Delivery) error { log.Printf("%s %q", d.ID, d.Payload); return nil }
	if err := consumer.Run(context.Background(), handle); err != nil { // returning nil acks; an error fails the entry
		log.Fatal(err)
	}
}

func ExampleStreams_Append() {
	conn, err := echomq.Dial("127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	streams := echomq.NewStreams(conn)
	appended, err := streams.Append(context.Background(), "orders", map[string][]byte{"total": []byte("42.00")}, echomq.AppendOptions{MaxLen: 100_000})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(appended.ID, appended.StreamID)
}

// An append answered UNAVAILABLE (or DEADLINE_EXCEEDED) may have been
// written: retried with the same dedup key, it is written once at most.
func ExampleAppendOptions() {
	conn, err := echomq.Dial("127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	streams := echomq.NewStreams(conn)
	fields := map[string][]byte{"order": []byte("1001"), "total": []byte("42.00")}
	var appended echomq.AppendResult
	for attempt := 0; ; attempt++ {
		appended, err = streams.Append(context.Background(), "orders", fields, echomq.AppendOptions{DedupKey: "order-1001"})
		if err == nil || attempt == 4 || echomq.IsPermanent(status.Code(err)) {
			break
		}
		time.Sleep(500 * time.Millisecond << attempt) // same call, same key
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(appended.ID, appended.Duplicate) // Duplicate: an earlier attempt had written it
}

func ExampleConsumer_Stop() {
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Target: "127.0.0.1:50051", Stream: "orders", Group: "billing", Start: echomq.StartNew(), FlowControl: echomq.FlowControl{Concurrency: 8}})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// … on SIGTERM: no new deliveries; running handlers get 10 s to finish.
		if err := consumer.Stop(ctx); err != nil {
			log.Print(err)
		}
	}()
	if err := consumer.Run(context.Background(), func(ctx context.Context, d *echomq.Delivery) error {
		if len(d.Payload["total"]) == 0 {
			return d.DeadLetter("no total") // poison: no point retrying
		}
		if busy() {
			return d.Fail("downstream busy", 5*time.Second)
		}
		return nil
	}); err != nil {
		log.Fatal(err) // a permanent error, e.g. INVALID_ARGUMENT
	}
}

func ExampleNewerWins() {
	versions := echomq.NewMemoryVersionStore() // or a VersionStore on your database
	handler := echomq.NewerWins(versions,
		func(d *echomq.Delivery) string { return string(d.Payload["order_id"]) },
		func(ctx context.Context, d *echomq.Delivery) error {
			return saveOrderState(ctx, d.Payload) // runs only for a newer update of this order
		})
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{Target: "127.0.0.1:50051", Stream: "orders", Group: "state", Start: echomq.StartBeginning(), FlowControl: echomq.FlowControl{Concurrency: 1}})
	log.Fatal(consumer.Run(context.Background(), handler))
}

// A batch handler gets the deliveries of one frame together (1 to MaxBatch)
// and answers each: here one bulk write per batch, with a verdict per entry.
func ExampleConsumer_RunBatch() {
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Target: "127.0.0.1:50051", Stream: "orders", Group: "warehouse", Start: echomq.StartBeginning(),
		FlowControl: echomq.FlowControl{
			MaxInFlight: 1024, // credit for several frames in flight
			MaxBatch:    256,  // the most deliveries per frame, and per call of the handler
			Concurrency: 4,    // batch handlers at once
		},
	})
	err := consumer.RunBatch(context.Background(), func(ctx context.Context, batch []*echomq.Delivery) []error {
		rows := make([]map[string][]byte, len(batch))
		for i, d := range batch {
			rows[i] = d.Payload
		}
		return insertRows(ctx, rows) // nil: all acked; else one error (or nil) per delivery
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A handler says whose fault a failure was: the database being down costs the
// entry no attempt, a payload that cannot be parsed is dead-lettered at once.
func ExampleTransient() {
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Target: "127.0.0.1:50051", Stream: "orders", Group: "billing", Start: echomq.StartBeginning(),
		MaxDeliveries: 5,
	})
	err := consumer.Run(context.Background(), func(ctx context.Context, d *echomq.Delivery) error {
		amount, err := strconv.Atoi(string(d.Payload["amount"]))
		if err != nil {
			return echomq.Poison(err) // can never succeed: dead-lettered now
		}
		if err := saveOrderState(ctx, map[string][]byte{"amount": []byte(strconv.Itoa(amount))}); err != nil {
			return echomq.Transient(err) // the database is down: delivered again, Attempts unchanged
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

func insertRows(context.Context, []map[string][]byte) []error { return nil }

// Per-key limits: one customer's entries run one at a time, in stream order,
// while other customers' run beside them (the README's "Per-key ordering").
func ExampleConsumerConfig_keyField() {
	conn, err := echomq.Dial("127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: "orders", Group: "billing", Start: echomq.StartBeginning(),
		FlowControl:       echomq.FlowControl{MaxInFlight: 64},
		KeyField:          "customer", // the payload field whose value is the key
		MaxInFlightPerKey: 1,          // one customer's entries run one at a time, in order
	})
	err = consumer.Run(ctx, func(ctx context.Context, d *echomq.Delivery) error {
		return apply(ctx, d.Payload["customer"], d.Payload)
	})
	var refused *echomq.SubscriptionError
	if errors.As(err, &refused) {
		log.Fatal(refused) // e.g. INVALID_ARGUMENT: the sidecar's message names the setting
	}
}

func apply(context.Context, []byte, map[string][]byte) error  { return nil }
func busy() bool                                              { return false }
func saveOrderState(context.Context, map[string][]byte) error { return nil }

func ExampleStreams_ReadAll() {
	conn, err := echomq.Dial("127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	streams := echomq.NewStreams(conn)
	// The last hour of "orders", 500 entries per page, oldest first.
	for e, err := range streams.ReadAll(context.Background(), "orders", echomq.ReadRange{StartTime: time.Now().Add(-time.Hour), Count: 500}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.StreamID, e.ID, e.Payload)
	}
}

func ExampleStreams_CancelScheduled() {
	conn, err := echomq.Dial("127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	streams := echomq.NewStreams(conn)
	ctx := context.Background()
	// A reminder an hour from now: not in the stream (nor delivered) until then.
	reminder, err := streams.Append(ctx, "reminders", map[string][]byte{"order": []byte("42")}, echomq.AppendOptions{Delay: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	for e, err := range streams.Scheduled(ctx, "reminders", echomq.ListScheduledOptions{}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.ID, e.DeliverAt)
	}
	// The order was paid: the reminder must never be delivered.
	switch _, err := streams.CancelScheduled(ctx, reminder.Stream, reminder.ID); {
	case errors.Is(err, echomq.ErrNotScheduled):
		fmt.Println("too late: the reminder is in the stream already")
	case err != nil:
		log.Fatal(err)
	}
}

func ExampleAdmin_ReplayDeadLetters() {
	conn, err := echomq.Dial("127.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	admin := echomq.NewAdmin(conn)
	ctx := context.Background()
	// Replay the dead letters of "orders" that failed on a timeout.
	var ids []string
	for dl, err := range admin.DeadLetters(ctx, "orders", echomq.DeadLetterRange{}) {
		if err != nil {
			log.Fatal(err)
		}
		if strings.Contains(dl.Reason, "timeout") {
			ids = append(ids, dl.Entry.StreamID)
		}
	}
	if len(ids) == 0 {
		return
	}
	replay, err := admin.ReplayDeadLetters(ctx, "orders", echomq.ReplayOptions{IDs: ids})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(replay.Replayed), "replayed;", len(replay.NotFoundIDs), "already gone")
}
