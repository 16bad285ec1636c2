package echomq_test

import (
	"context"
	"encoding/json"
	"log"
	"strconv"
	"testing"
	"time"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// The worked pipeline of docs/src/pipelines.md: the page includes the code
// between the ANCHOR lines from here, and TestPipelinePricesEachOrderOnce
// runs it against the real sidecar.

// ANCHOR: handler
// price is the pipeline's one step: it reads an order from `{orders}:placed`
// and appends its priced form to `{orders}:priced`, in the same step as the
// acknowledgement (one hash tag, so both streams share a Redis Cluster slot).
func price(ctx context.Context, d *echomq.Delivery) error {
	var order struct {
		ID    string `json:"id"`
		Lines []struct {
			Qty   int `json:"qty"`
			Cents int `json:"cents"`
		} `json:"lines"`
	}
	if err := json.Unmarshal(d.Payload["order"], &order); err != nil {
		return echomq.Poison(err) // it will never parse: dead-letter it now
	}
	total := 0
	for _, line := range order.Lines {
		total += line.Qty * line.Cents
	}
	emitted, err := d.AckEmit(echomq.Emit{Stream: "{orders}:priced", Fields: map[string][]byte{
		"source":      []byte(d.ID), // the placed order's branded id: downstream's idempotency key
		"order":       []byte(order.ID),
		"total_cents": []byte(strconv.Itoa(total)),
	}})
	if err != nil {
		return err // refused: a bad emit fails the delivery; any other refusal settled it already
	}
	log.Printf("order %s priced: %s", order.ID, emitted[0].ID)
	return nil
}

// ANCHOR_END: handler

func TestPipelinePricesEachOrderOnce(t *testing.T) {
	cl := fixture(t)
	if _, err := redisDo(cl.redisAddr, "DEL", "{orders}:placed", "{orders}:priced"); err != nil {
		t.Fatal(err)
	}
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	orders := []string{
		`{"id":"A-1","lines":[{"qty":2,"cents":150}]}`,
		`{"id":"A-2","lines":[{"qty":1,"cents":999},{"qty":3,"cents":1}]}`,
		`{"id":"A-3","lines":[]}`,
	}
	var placed []string
	for _, o := range orders {
		a, err := echomq.NewStreams(conn).Append(withTimeout(t, 10*time.Second), "{orders}:placed", map[string][]byte{"order": []byte(o)})
		if err != nil {
			t.Fatal(err)
		}
		placed = append(placed, a.ID)
	}
	// ANCHOR: consumer
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: "{orders}:placed", Group: "pricing", Start: echomq.StartBeginning(),
	})
	// ANCHOR_END: consumer
	done := make(chan error, 1)
	go func() { done <- consumer.Run(context.Background(), price) }()
	if err := waitFor(20*time.Second, func() bool {
		return redisInt(t, cl.redisAddr, "XLEN", "{orders}:priced") == int64(len(orders))
	}); err != nil {
		t.Fatalf("the priced orders: %v", err)
	}
	if err := consumer.Stop(withTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	reply, err := redisDo(cl.redisAddr, "XRANGE", "{orders}:priced", "-", "+")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{placed[0]: "A-1 300", placed[1]: "A-2 1002", placed[2]: "A-3 0"}
	got := map[string]string{}
	for _, raw := range reply.([]any) {
		flat := raw.([]any)[1].([]any)
		fields := map[string]string{}
		for i := 0; i+1 < len(flat); i += 2 {
			fields[flat[i].(string)] = flat[i+1].(string)
		}
		if _, twice := got[fields["source"]]; twice {
			t.Errorf("order %s priced twice", fields["source"])
		}
		got[fields["source"]] = fields["order"] + " " + fields["total_cents"]
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("priced %s: %q, want %q (all: %v)", id, got[id], w, got)
		}
	}
	if n := redisInt(t, cl.redisAddr, "XPENDING", "{orders}:placed", "pricing"); n != 0 {
		t.Errorf("XPENDING %d, want 0: every AckEmit acknowledged its order", n)
	}
}
