package echomq_test

// Streams (Read, Trim) and Admin (DescribeGroup, dead letters) against the
// real sidecar and redis-server of the fixture.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echomq "github.com/echomq/echomq-sidecar/clients/go"
)

// dialFixture is a connection to the shared sidecar, closed with the test.
func dialFixture(t *testing.T) (*cluster, *grpc.ClientConn) {
	t.Helper()
	cl := fixture(t)
	conn, err := echomq.Dial(cl.listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return cl, conn
}

// appendN appends n entries (field n = 0…n-1) to stream in one batch.
func appendN(t *testing.T, conn *grpc.ClientConn, stream string, n int) []echomq.AppendResult {
	t.Helper()
	entries := make([]map[string][]byte, n)
	for i := range entries {
		entries[i] = map[string][]byte{"n": []byte(strconv.Itoa(i))}
	}
	appended, err := echomq.NewStreams(conn).AppendBatch(withTimeout(t, 10*time.Second), stream, entries)
	if err != nil {
		t.Fatal(err)
	}
	return appended
}

// streamMillis is the milliseconds part of a stream id.
func streamMillis(t *testing.T, id string) int64 {
	t.Helper()
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		t.Fatalf("stream id %q: %v", id, err)
	}
	return n
}

func TestReadPagesThroughARangeByNextStartID(t *testing.T) {
	_, conn := dialFixture(t)
	stream := uniqueStream("go:read-pages")
	appended := appendN(t, conn, stream, 25)
	streams := echomq.NewStreams(conn)
	ctx := withTimeout(t, 20*time.Second)

	page, err := streams.Read(ctx, stream, echomq.ReadRange{Count: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 10 || page.NextStartID != appended[10].StreamID {
		t.Fatalf("first page: %d entries, next %q; want 10 and %q", len(page.Entries), page.NextStartID, appended[10].StreamID)
	}
	for i, e := range page.Entries {
		if e.ID != appended[i].ID || e.StreamID != appended[i].StreamID || string(e.Payload["n"]) != strconv.Itoa(i) || e.MintedAt.IsZero() {
			t.Fatalf("entry %d: %+v, want %+v with n=%d", i, e, appended[i], i)
		}
	}

	var got []string
	pages := 0
	for e, err := range streams.ReadAll(ctx, stream, echomq.ReadRange{Count: 10}) {
		if err != nil {
			t.Fatal(err)
		}
		if len(got)%10 == 0 {
			pages++
		}
		got = append(got, e.ID)
	}
	var want []string
	for _, a := range appended {
		want = append(want, a.ID)
	}
	if !slices.Equal(got, want) || pages != 3 {
		t.Fatalf("ReadAll: %d entries in %d pages, want the 25 appended in order in 3", len(got), pages)
	}

	// An end bound is kept across pages; breaking out stops the reads.
	got = got[:0]
	for e, err := range streams.ReadAll(ctx, stream, echomq.ReadRange{StartID: appended[3].StreamID, EndID: appended[14].StreamID, Count: 4}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.ID)
	}
	if !slices.Equal(got, want[3:15]) {
		t.Fatalf("ReadAll of [3, 14]: %v, want %v", got, want[3:15])
	}
	n := 0
	for range streams.ReadAll(ctx, stream, echomq.ReadRange{Count: 2}) {
		n++
		if n == 3 {
			break
		}
	}
	if n != 3 {
		t.Fatalf("break after 3: %d", n)
	}
}

func TestReadByInstant(t *testing.T) {
	_, conn := dialFixture(t)
	stream := uniqueStream("go:read-instant")
	early := appendN(t, conn, stream, 3)
	time.Sleep(5 * time.Millisecond) // the next batch gets later milliseconds
	late := appendN(t, conn, stream, 2)
	if streamMillis(t, late[0].StreamID) <= streamMillis(t, early[2].StreamID) {
		t.Fatalf("batches share a millisecond: %v %v", early, late)
	}
	streams := echomq.NewStreams(conn)
	ctx := withTimeout(t, 10*time.Second)

	from := time.UnixMilli(streamMillis(t, late[0].StreamID))
	page, err := streams.Read(ctx, stream, echomq.ReadRange{StartTime: from})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 2 || page.Entries[0].ID != late[0].ID || page.Entries[1].ID != late[1].ID {
		t.Fatalf("from %v: %+v, want the 2 late entries", from, page.Entries)
	}
	until := time.UnixMilli(streamMillis(t, early[2].StreamID))
	page, err = streams.Read(ctx, stream, echomq.ReadRange{EndTime: until})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 3 || page.Entries[2].ID != early[2].ID {
		t.Fatalf("until %v: %d entries, want the 3 early ones", until, len(page.Entries))
	}
	// Paging from an instant continues by id.
	var got []string
	for e, err := range streams.ReadAll(ctx, stream, echomq.ReadRange{StartTime: time.UnixMilli(streamMillis(t, early[0].StreamID)), Count: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.ID)
	}
	if len(got) != 5 {
		t.Fatalf("ReadAll from the first instant, pages of 2: %d entries, want 5", len(got))
	}
}

func TestReadErrorsCarryTheStatus(t *testing.T) {
	_, conn := dialFixture(t)
	streams := echomq.NewStreams(conn)
	ctx := withTimeout(t, 10*time.Second)
	_, err := streams.Read(ctx, uniqueStream("go:read-bad"), echomq.ReadRange{StartID: "1-0", StartTime: time.Now()})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an id and an instant for one bound: %v, want INVALID_ARGUMENT", err)
	}
	var yielded []error
	for _, err := range streams.ReadAll(ctx, uniqueStream("go:read-bad"), echomq.ReadRange{Count: 10_001}) {
		yielded = append(yielded, err)
	}
	if len(yielded) != 1 || status.Code(yielded[0]) != codes.InvalidArgument {
		t.Fatalf("ReadAll with Count over 10,000 yielded %v, want one INVALID_ARGUMENT", yielded)
	}
	page, err := streams.Read(ctx, uniqueStream("go:read-absent"), echomq.ReadRange{})
	if err != nil || len(page.Entries) != 0 || page.NextStartID != "" {
		t.Fatalf("a stream that does not exist: %+v %v, want an empty last page", page, err)
	}
}

func TestTrimIsSafeByDefaultAndIgnoresGroupsOnlyWhenAsked(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:trim")
	appended := appendN(t, conn, stream, 10)
	// A group that has read nothing yet: every entry is undelivered to it.
	if _, err := redisDo(cl.redisAddr, "XGROUP", "CREATE", stream, "g", "0"); err != nil {
		t.Fatal(err)
	}
	streams := echomq.NewStreams(conn)
	ctx := withTimeout(t, 10*time.Second)

	safe, err := streams.Trim(ctx, stream, echomq.TrimBound{MaxLen: 2})
	if err != nil {
		t.Fatal(err)
	}
	if safe.Count != 0 || !safe.HeldBackByGroups || redisInt(t, cl.redisAddr, "XLEN", stream) != 10 {
		t.Fatalf("safe trim: %+v, XLEN %d; want nothing removed, held back by the group", safe, redisInt(t, cl.redisAddr, "XLEN", stream))
	}
	forced, err := streams.Trim(ctx, stream, echomq.TrimBound{MaxLen: 2, IgnoreGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	if forced.Count != 8 || forced.HeldBackByGroups || forced.AppliedMinID != appended[8].StreamID {
		t.Fatalf("trim ignoring groups: %+v, want 8 removed below %s", forced, appended[8].StreamID)
	}
	page, err := streams.Read(ctx, stream, echomq.ReadRange{})
	if err != nil || len(page.Entries) != 2 || page.Entries[0].ID != appended[8].ID {
		t.Fatalf("after trimming to 2: %+v %v", page.Entries, err)
	}
}

func TestTrimByMinIDAndBeforeAnInstant(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:trim-bounds")
	early := appendN(t, conn, stream, 4)
	time.Sleep(5 * time.Millisecond)
	late := appendN(t, conn, stream, 3)
	streams := echomq.NewStreams(conn)
	ctx := withTimeout(t, 10*time.Second)

	byID, err := streams.Trim(ctx, stream, echomq.TrimBound{MinID: early[2].StreamID})
	if err != nil || byID.Count != 2 || byID.AppliedMinID != early[2].StreamID {
		t.Fatalf("trim below %s: %+v %v, want 2 removed", early[2].StreamID, byID, err)
	}
	before, err := streams.Trim(ctx, stream, echomq.TrimBound{Before: time.UnixMilli(streamMillis(t, late[0].StreamID))})
	if err != nil || before.Count != 2 {
		t.Fatalf("trim before the late batch: %+v %v, want the 2 early entries left removed", before, err)
	}
	if n := redisInt(t, cl.redisAddr, "XLEN", stream); n != 3 {
		t.Fatalf("XLEN %d, want the 3 late entries", n)
	}
	if _, err := streams.Trim(ctx, stream, echomq.TrimBound{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("trim without a bound: %v, want INVALID_ARGUMENT", err)
	}
}

func TestDescribeGroupReportsPendingConsumersAndLag(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:describe")
	appended := appendN(t, conn, stream, 5)
	if _, err := redisDo(cl.redisAddr, "XGROUP", "CREATE", stream, "g", "0"); err != nil {
		t.Fatal(err)
	}
	// A consumer c1 reads two entries and acknowledges neither.
	if _, err := redisDo(cl.redisAddr, "XREADGROUP", "GROUP", "g", "c1", "COUNT", "2", "STREAMS", stream, ">"); err != nil {
		t.Fatal(err)
	}
	admin := echomq.NewAdmin(conn)
	ctx := withTimeout(t, 10*time.Second)
	info, err := admin.DescribeGroup(ctx, stream, "g")
	if err != nil {
		t.Fatal(err)
	}
	if info.Stream != stream || info.Group != "g" || info.Pending != 2 || info.StreamLength != 5 ||
		info.LastDeliveredID != appended[1].StreamID || info.OldestPendingID != appended[0].StreamID ||
		info.MaxDeliveryCount != 1 || info.OldestPendingAge <= 0 || info.OldestPendingAge > time.Minute {
		t.Fatalf("describe: %+v", info)
	}
	if !info.LagKnown || info.Lag != 3 {
		t.Fatalf("lag %d (known %v), want 3", info.Lag, info.LagKnown)
	}
	if len(info.Consumers) != 1 || info.Consumers[0].Name != "c1" || info.Consumers[0].Pending != 2 || info.Consumers[0].Idle < 0 {
		t.Fatalf("consumers: %+v, want c1 with 2 pending", info.Consumers)
	}
	if len(info.Shards) != 0 {
		t.Fatalf("a plain stream has no shards: %+v", info.Shards)
	}
	_, err = admin.DescribeGroup(ctx, stream, "no-such-group")
	if status.Code(err) != codes.NotFound {
		t.Fatalf("an unknown group: %v, want NOT_FOUND", err)
	}
}

// With per-key limits, DescribeGroup reports the keyed entries and the busy
// keys: a key's head is held by the consumer, its later entries wait.
func TestDescribeGroupReportsBusyKeys(t *testing.T) {
	_, conn := dialFixture(t)
	stream := uniqueStream("go:busy-keys")
	var entries []map[string][]byte
	for _, key := range []string{"c0", "c0", "c1", "c0"} {
		entries = append(entries, map[string][]byte{"customer": []byte(key)})
	}
	appended, err := echomq.NewStreams(conn).AppendBatch(withTimeout(t, 10*time.Second), stream, entries)
	if err != nil {
		t.Fatal(err)
	}
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(),
		FlowControl: echomq.FlowControl{MaxInFlight: 8}, KeyField: "customer", MaxInFlightPerKey: 1,
	})
	release := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		done <- consumer.Run(ctx, func(context.Context, *echomq.Delivery) error {
			<-release
			return nil
		})
	}()
	admin := echomq.NewAdmin(conn)
	var info echomq.GroupInfo
	if err := waitFor(10*time.Second, func() bool {
		info, err = admin.DescribeGroup(withTimeout(t, 5*time.Second), stream, "g")
		return err == nil && info.KeyedEntries == 4 && len(info.BusyKeys) == 2
	}); err != nil {
		t.Fatalf("describe: %+v (%v), want 4 keyed entries over 2 busy keys", info, err)
	}
	c0, c1 := info.BusyKeys[0], info.BusyKeys[1]
	if string(c0.Key) != "c0" || c0.Entries != 3 || c0.HeadID != appended[0].StreamID || c0.HeadConsumer == "" ||
		string(c1.Key) != "c1" || c1.Entries != 1 || c1.HeadID != appended[2].StreamID || c1.HeadConsumer != c0.HeadConsumer {
		t.Fatalf("busy keys: %+v, want c0 (3, head %s) then c1 (1, head %s)", info.BusyKeys, appended[0].StreamID, appended[2].StreamID)
	}
	close(release)
	stopRun(t, consumer, done)
}

// deadLetterAll runs a consumer that dead-letters every entry of stream with
// reason "bad <n>", until n dead letters are in dlq.
func deadLetterAll(t *testing.T, cl *cluster, conn *grpc.ClientConn, stream, dlq string, n int) {
	t.Helper()
	consumer := echomq.NewConsumer(echomq.ConsumerConfig{
		Conn: conn, Stream: stream, Group: "g", Start: echomq.StartBeginning(), DeadLetterStream: dlq,
	})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // a failed wait must not leave it reconnecting
	go func() {
		done <- consumer.Run(ctx, func(_ context.Context, d *echomq.Delivery) error {
			return d.DeadLetter("bad " + string(d.Payload["n"]))
		})
	}()
	if err := waitFor(20*time.Second, func() bool { return redisLen(cl.redisAddr, dlq) >= int64(n) }); err != nil {
		t.Fatalf("%d of %d dead letters in %s", redisLen(cl.redisAddr, dlq), n, dlq)
	}
	stopRun(t, consumer, done)
}

// redisLen is XLEN, 0 for a missing key or an error.
func redisLen(addr, key string) int64 {
	reply, err := redisDo(addr, "XLEN", key)
	if err != nil {
		return 0
	}
	n, _ := reply.(int64)
	return n
}

func TestDeadLettersListPageAndReplayToTheSource(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:dlq")
	appended := appendN(t, conn, stream, 5)
	deadLetterAll(t, cl, conn, stream, stream+":dlq", 5)
	admin := echomq.NewAdmin(conn)
	ctx := withTimeout(t, 20*time.Second)

	page, err := admin.ListDeadLetters(ctx, stream, echomq.DeadLetterRange{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.DeadLetters) != 2 || page.NextStartID == "" {
		t.Fatalf("first page: %+v, want 2 and a next page", page)
	}
	var all []echomq.DeadLetter
	for dl, err := range admin.DeadLetters(ctx, stream, echomq.DeadLetterRange{Count: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, dl)
	}
	if len(all) != 5 {
		t.Fatalf("DeadLetters: %d, want 5", len(all))
	}
	byID := map[string]echomq.DeadLetter{}
	for _, dl := range all {
		byID[dl.Entry.ID] = dl
	}
	for i, a := range appended {
		dl, ok := byID[a.ID]
		if !ok {
			t.Fatalf("entry %s is not among the dead letters (the branded id must be kept)", a.ID)
		}
		if dl.SourceStream != stream || dl.SourceID != a.StreamID || dl.Group != "g" || dl.Attempts != 1 ||
			dl.Reason != "bad "+strconv.Itoa(i) || string(dl.Entry.Payload["n"]) != strconv.Itoa(i) ||
			dl.DeadLetteredAt.IsZero() || dl.Entry.StreamID == a.StreamID {
			t.Fatalf("dead letter of %s: %+v", a.ID, dl)
		}
		if _, meta := dl.Entry.Payload["echomq.reason"]; meta {
			t.Fatalf("dead letter payload carries metadata: %v", dl.Entry.Payload)
		}
	}

	// Replay two by their dead-letter ids: back in the source with their
	// branded ids, gone from the dead-letter stream.
	pick := []string{all[0].Entry.StreamID, all[3].Entry.StreamID}
	replay, err := admin.ReplayDeadLetters(ctx, stream, echomq.ReplayOptions{IDs: append(pick, "1-1")})
	if err != nil {
		t.Fatal(err)
	}
	if len(replay.Replayed) != 2 || replay.Replayed[0].ID != all[0].Entry.ID || replay.Replayed[0].DeadLetterID != pick[0] ||
		replay.Replayed[1].ID != all[3].Entry.ID || !slices.Equal(replay.NotFoundIDs, []string{"1-1"}) {
		t.Fatalf("replay: %+v", replay)
	}
	if n := redisLen(cl.redisAddr, stream+":dlq"); n != 3 {
		t.Fatalf("XLEN dlq %d after replaying 2 of 5, want 3", n)
	}
	tail, err := echomq.NewStreams(conn).Read(ctx, stream, echomq.ReadRange{StartID: replay.Replayed[0].StreamID})
	if err != nil {
		t.Fatal(err)
	}
	if len(tail.Entries) != 2 || tail.Entries[0].ID != all[0].Entry.ID || tail.Entries[1].ID != all[3].Entry.ID ||
		tail.Entries[0].StreamID != replay.Replayed[0].StreamID {
		t.Fatalf("source after replay: %+v, want the 2 replayed entries with their branded ids", tail.Entries)
	}

	// Replay the oldest rest by count.
	rest, err := admin.ReplayDeadLetters(ctx, stream, echomq.ReplayOptions{Count: 10})
	if err != nil || len(rest.Replayed) != 3 {
		t.Fatalf("replay by count: %+v %v, want 3", rest, err)
	}
	if n := redisLen(cl.redisAddr, stream+":dlq"); n != 0 {
		t.Fatalf("XLEN dlq %d, want 0", n)
	}
}

func TestReplayWithoutAGroupIsRefused(t *testing.T) {
	cl, conn := dialFixture(t)
	stream := uniqueStream("go:dlq-nogroup")
	appendN(t, conn, stream, 1)
	deadLetterAll(t, cl, conn, stream, stream+":dlq", 1)
	if _, err := redisDo(cl.redisAddr, "XGROUP", "DESTROY", stream, "g"); err != nil {
		t.Fatal(err)
	}
	_, err := echomq.NewAdmin(conn).ReplayDeadLetters(withTimeout(t, 10*time.Second), stream, echomq.ReplayOptions{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("replay to a stream without a group: %v, want FAILED_PRECONDITION", err)
	}
	var st interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &st) {
		t.Fatalf("%v does not carry a gRPC status", err)
	}
}
