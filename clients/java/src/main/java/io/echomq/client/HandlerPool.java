package io.echomq.client;

import java.lang.System.Logger.Level;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Consumer;

/**
 * The consumer's fixed set of handler threads: {@code workers} threads, started once, each taking
 * items (a delivery, or a frame for a batch handler) from one bounded queue and running them.
 * Nothing is created per delivery. Shared by the consumer's calls, so a handler of a broken call
 * still counts against the bound while the next call delivers.
 */
final class HandlerPool {
  private static final System.Logger LOG = System.getLogger(HandlerPool.class.getName());

  private final BlockingQueue<Object> queue;
  private final Consumer<Object> run;
  private final Thread[] threads;
  private final boolean[] busy;
  private final Object lock = new Object();
  /** Set once: take nothing more; guarded by {@code lock}. */
  private boolean shutdown;
  private boolean started;

  /**
   * @param workers the number of threads
   * @param capacity the most items waiting (the call's max_in_flight: the sidecar never hands out
   *     more, so the queue fills only with a broken call's leftovers)
   * @param run runs one item on a worker thread
   */
  HandlerPool(int workers, int capacity, String name, Consumer<Object> run) {
    this.queue = new ArrayBlockingQueue<>(Math.max(1, capacity));
    this.run = run;
    this.threads = new Thread[workers];
    this.busy = new boolean[workers];
    for (int i = 0; i < workers; i++) {
      int index = i;
      Thread thread = new Thread(() -> work(index), name + (i + 1));
      thread.setDaemon(true);
      threads[i] = thread;
    }
  }

  /** Starts the threads (once). */
  void start() {
    synchronized (lock) {
      if (started || shutdown) {
        return;
      }
      started = true;
    }
    for (Thread thread : threads) {
      thread.start();
    }
  }

  /**
   * Queues {@code item}, waiting while the queue is full for as long as {@code wanted} holds.
   *
   * @return false when it was not queued (no longer wanted, or the pool shut down)
   */
  boolean offer(Object item, BooleanSupplier wanted) {
    try {
      while (!queue.offer(item, 20, TimeUnit.MILLISECONDS)) {
        if (!wanted.getAsBoolean() || isShutdown()) {
          return false;
        }
      }
      return true;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  private boolean isShutdown() {
    synchronized (lock) {
      return shutdown;
    }
  }

  private void work(int index) {
    while (true) {
      Object item;
      try {
        item = queue.take();
      } catch (InterruptedException e) {
        if (isShutdown()) {
          return;
        }
        continue;
      }
      synchronized (lock) {
        if (shutdown) {
          return; // Taken but never started: it stays pending and comes back.
        }
        busy[index] = true;
      }
      try {
        run.accept(item);
      } catch (Throwable t) {
        LOG.log(Level.WARNING, "handler worker caught", t);
      } finally {
        synchronized (lock) {
          busy[index] = false;
          Thread.interrupted(); // An interrupt meant for the finished handler ends with it.
          if (shutdown) {
            return;
          }
        }
      }
    }
  }

  /** Takes the waiting items out of the queue, in order: no thread starts them. */
  List<Object> takeWaiting() {
    List<Object> waiting = new ArrayList<>();
    queue.drainTo(waiting);
    return waiting;
  }

  /** No item starts from now on; idle threads end, running items finish. Waiting items are dropped. */
  void shutdown() {
    synchronized (lock) {
      if (shutdown) {
        return;
      }
      shutdown = true;
      for (int i = 0; i < threads.length; i++) {
        if (!busy[i]) {
          threads[i].interrupt();
        }
      }
    }
    queue.clear();
  }

  /** {@link #shutdown()}, and interrupts the running items too. */
  void shutdownNow() {
    shutdown();
    for (Thread thread : threads) {
      thread.interrupt();
    }
  }

  /** Waits up to {@code nanos} for every thread to end (after a shutdown); true when they all did. */
  boolean awaitTermination(long nanos) throws InterruptedException {
    long until = System.nanoTime() + nanos;
    for (Thread thread : threads) {
      long left = until - System.nanoTime();
      if (left > 0) {
        TimeUnit.NANOSECONDS.timedJoin(thread, left);
      }
      if (thread.isAlive()) {
        return false;
      }
    }
    return true;
  }
}
