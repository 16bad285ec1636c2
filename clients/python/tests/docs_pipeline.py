"""The worked pipeline of docs/src/pipelines.md: the page includes the code
between the ANCHOR lines from here, and test_ack_emit.py runs it against the
real sidecar."""

from __future__ import annotations

# ANCHOR: pipeline
import json

from echomq import Consumer, Delivery, Emit, PoisonError, Start


async def price(delivery: Delivery) -> None:
    """Reads an order from `{orders}:placed` and appends its priced form to
    `{orders}:priced`, in the same step as the acknowledgement (one hash tag,
    so both streams share a Redis Cluster slot)."""
    try:
        order = json.loads(delivery.payload["order"])
    except ValueError as error:
        raise PoisonError(f"not an order: {error}") from error  # it will never parse: dead-letter it now
    total = sum(line["qty"] * line["cents"] for line in order["lines"])
    priced = {
        "source": delivery.id,  # the placed order's branded id: downstream's idempotency key
        "order": order["id"],
        "total_cents": str(total),
    }
    # Raises AckEmitError when refused: a bad emit then fails the delivery
    # (the error propagates); any other refusal settled it already.
    [emitted] = await delivery.ack_emit([Emit("{orders}:priced", priced)])
    print(f"order {order['id']} priced: {emitted.id}")


def pricing(target: str = "127.0.0.1:50051") -> Consumer:
    """The pipeline's consumer: `async with pricing() as consumer: await consumer.wait()`."""
    return Consumer(target, "{orders}:placed", "pricing", price, start=Start.BEGINNING)


# ANCHOR_END: pipeline
