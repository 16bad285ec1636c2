package echomq_test

// Scheduled entries (AppendOptions.DeliverAt and Delay, BatchEntry's,
// CancelScheduled, ListScheduled and Scheduled) against the shared fixture:
// what the client sends and answers, and the sidecar's refusals. The
// deliveries themselves are the conformance scenarios scheduled_delivery and
// scheduled_cancel.

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

func TestScheduledAppendIsListedNotReadThenEntersTheStream(t *testing.T) {
	streams, _ := dedupProducer(t)
	ctx := context.Background()
	stream := "go:scheduled:enters:" + time.Now().Format("150405.000000")
	due := time.Now().Add(time.Second)
	later, err := streams.Append(ctx, stream, map[string][]byte{"n": []byte("1")}, echomq.AppendOptions{DeliverAt: due})
	if err != nil {
		t.Fatal(err)
	}
	if !later.Scheduled || later.StreamID != "" || len(later.ID) != 28 {
		t.Fatalf("scheduled append answered %+v", later)
	}
	now, err := streams.Append(ctx, stream, map[string][]byte{"n": []byte("0")})
	if err != nil || now.Scheduled || now.StreamID == "" {
		t.Fatalf("plain append answered %+v, %v", now, err)
	}
	page, err := streams.ListScheduled(ctx, stream, echomq.ListScheduledOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if page.Total != 1 || page.NextPageToken != "" || len(page.Entries) != 1 {
		t.Fatalf("ListScheduled: %+v", page)
	}
	if e := page.Entries[0]; e.ID != later.ID || string(e.Fields["n"]) != "1" || e.DeliverAt.Sub(due).Abs() > 2*time.Millisecond {
		t.Fatalf("listed %+v, want id %s due %v", e, later.ID, due)
	}
	read, err := streams.Read(ctx, stream, echomq.ReadRange{})
	if err != nil || len(read.Entries) != 1 || read.Entries[0].ID != now.ID {
		t.Fatalf("Read before due: %+v, %v", read, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		read, err = streams.Read(ctx, stream, echomq.ReadRange{})
		if err != nil {
			t.Fatal(err)
		}
		if len(read.Entries) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the scheduled entry never entered the stream")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if time.Now().Before(due.Add(-5 * time.Millisecond)) {
		t.Fatalf("the entry entered the stream before it was due (%v)", due)
	}
	if read.Entries[1].ID != later.ID {
		t.Fatalf("the moved entry has id %s, the append answered %s", read.Entries[1].ID, later.ID)
	}
}

func TestListScheduledPagesAndCancelAnswersTheDueTime(t *testing.T) {
	streams, _ := dedupProducer(t)
	ctx := context.Background()
	stream := "go:scheduled:pages:" + time.Now().Format("150405.000000")
	res, err := streams.AppendBatchEntries(ctx, stream, []echomq.BatchEntry{
		{Fields: map[string][]byte{"n": []byte("3")}, Delay: 3 * time.Minute},
		{Fields: map[string][]byte{"n": []byte("now")}},
		{Fields: map[string][]byte{"n": []byte("1")}, Delay: time.Minute},
		{Fields: map[string][]byte{"n": []byte("2")}, DeliverAt: time.Now().Add(2 * time.Minute)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := []bool{res[0].Scheduled, res[1].Scheduled, res[2].Scheduled, res[3].Scheduled}; !slices.Equal(got, []bool{true, false, true, true}) {
		t.Fatalf("Scheduled flags %v", got)
	}
	first, err := streams.ListScheduled(ctx, stream, echomq.ListScheduledOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if first.Total != 3 || first.NextPageToken == "" || len(first.Entries) != 2 || first.Entries[0].ID != res[2].ID || first.Entries[1].ID != res[3].ID {
		t.Fatalf("first page %+v", first)
	}
	var all []echomq.ScheduledEntry
	for e, err := range streams.Scheduled(ctx, stream, echomq.ListScheduledOptions{Count: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
	}
	if len(all) != 3 || all[2].ID != res[0].ID {
		t.Fatalf("Scheduled yielded %+v", all)
	}
	due, err := streams.CancelScheduled(ctx, stream, res[0].ID)
	if err != nil || !due.Equal(all[2].DeliverAt) {
		t.Fatalf("CancelScheduled: %v, %v; want due %v", due, err, all[2].DeliverAt)
	}
	for _, id := range []string{res[0].ID, res[1].ID} { // cancelled; appended at once
		_, err = streams.CancelScheduled(ctx, stream, id)
		if !errors.Is(err, echomq.ErrNotScheduled) || status.Code(err) != codes.NotFound {
			t.Fatalf("CancelScheduled of %s: %v, want ErrNotScheduled", id, err)
		}
	}
	rest, err := streams.ListScheduled(ctx, stream, echomq.ListScheduledOptions{})
	if err != nil || rest.Total != 2 {
		t.Fatalf("after the cancel: %+v, %v", rest, err)
	}
}

func TestScheduledRefusalsCarryTheSidecarsStatus(t *testing.T) {
	streams, _ := dedupProducer(t)
	ctx := context.Background()
	stream := "go:scheduled:refused:" + time.Now().Format("150405.000000")
	fields := map[string][]byte{"n": []byte("1")}
	_, err := streams.Append(ctx, stream, fields, echomq.AppendOptions{DeliverAt: time.Now().Add(time.Minute), Delay: time.Minute})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("DeliverAt and Delay: %v, want INVALID_ARGUMENT", err)
	}
	_, err = streams.AppendBatchEntries(ctx, stream, []echomq.BatchEntry{{Fields: fields, Delay: -time.Second}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a negative delay: %v, want INVALID_ARGUMENT", err)
	}
	_, err = streams.CancelScheduled(ctx, stream, "not-a-branded-id")
	if status.Code(err) != codes.InvalidArgument || errors.Is(err, echomq.ErrNotScheduled) {
		t.Fatalf("a bad id: %v, want INVALID_ARGUMENT", err)
	}
	_, err = streams.AppendBatch(ctx, stream, []map[string][]byte{fields}, echomq.AppendOptions{Delay: time.Minute})
	if err == nil || status.Code(err) != codes.Unknown {
		t.Fatalf("a batch-wide delay: %v, want the client's refusal", err)
	}
	if page, err := streams.ListScheduled(ctx, stream, echomq.ListScheduledOptions{}); err != nil || page.Total != 0 {
		t.Fatalf("something was scheduled: %+v, %v", page, err)
	}
}
