package echomq

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Start says where a consumer group begins reading when the subscription has to
// create it (`XGROUP CREATE … MKSTREAM`). It is ignored when the group exists:
// the group keeps its position.
//
// There is no default: the zero Start is refused, because guessing wrong either
// skips or replays a whole stream. Use [StartNew], [StartBeginning],
// [StartAfter] or [StartAt].
type Start struct {
	kind pb.GroupStart
	id   string
	at   time.Time
}

// StartNew starts a new group with the entries appended after it is created (`$`).
func StartNew() Start { return Start{kind: pb.GroupStart_GROUP_START_NEW} }

// StartBeginning starts a new group with every entry the stream holds, oldest first (`0`).
func StartBeginning() Start { return Start{kind: pb.GroupStart_GROUP_START_BEGINNING} }

// StartAfter starts a new group after the stream id `<ms>-<seq>` (or `<ms>`), exclusive.
func StartAfter(streamID string) Start {
	return Start{kind: pb.GroupStart_GROUP_START_ID, id: streamID}
}

// StartAt starts a new group with the entries appended at or after t.
func StartAt(t time.Time) Start { return Start{kind: pb.GroupStart_GROUP_START_INSTANT, at: t} }

// IsZero reports whether s is the zero Start, which a subscription refuses.
func (s Start) IsZero() bool { return s.kind == pb.GroupStart_GROUP_START_UNSPECIFIED }

// String names the position, for logs.
func (s Start) String() string {
	switch s.kind {
	case pb.GroupStart_GROUP_START_NEW:
		return "new"
	case pb.GroupStart_GROUP_START_BEGINNING:
		return "beginning"
	case pb.GroupStart_GROUP_START_ID:
		return "after " + s.id
	case pb.GroupStart_GROUP_START_INSTANT:
		return "at " + s.at.Format(time.RFC3339Nano)
	}
	return "unset"
}

func (s Start) apply(sub *pb.Subscribe) {
	sub.GroupStart = s.kind
	switch s.kind {
	case pb.GroupStart_GROUP_START_ID:
		sub.StartId = s.id
	case pb.GroupStart_GROUP_START_INSTANT:
		sub.StartTime = timestamppb.New(s.at)
	}
}
