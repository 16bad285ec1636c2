package io.echomq.client;

import io.echomq.v1.ConsumeRequest;

/**
 * Where a delivery's verdict goes: the one call that delivered it. A sink whose call has ended
 * drops what it is given, because the ids are not held by any other call (the sidecar delivers
 * them again).
 */
interface VerdictSink {
  /** Sends {@code request} on the call; false when the call has ended and it was dropped. */
  boolean send(ConsumeRequest request);
}
