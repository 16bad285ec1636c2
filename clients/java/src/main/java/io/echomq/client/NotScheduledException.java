package io.echomq.client;

import io.grpc.Status;

/**
 * {@link EchoMqStreams#cancelScheduled(String, String)} found no such entry scheduled on that
 * stream key (NOT_FOUND, so {@link #isPermanent()}): it entered the stream already (a cancel and a
 * move race, and exactly one wins), was cancelled, or was never scheduled there.
 */
public class NotScheduledException extends EchoMqException {
  private static final long serialVersionUID = 1L;

  /**
   * Creates the exception.
   *
   * @param message what was being cancelled and the sidecar's message
   * @param cause the underlying exception, or null
   */
  public NotScheduledException(String message, Throwable cause) {
    super(Status.Code.NOT_FOUND, message, cause);
  }
}
