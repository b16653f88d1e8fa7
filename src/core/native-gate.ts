// SECURITY-CRITICAL (process integrity): keeps Node from ending a worker thread while it is inside
// koffi. When the process exits, Node terminates every worker; a worker that is then loading koffi,
// binding functions or returning from a call makes koffi throw into a terminating isolate, and Node
// aborts the whole process (FATAL ERROR: Error::ThrowAsJavaScriptException napi_throw, exit 134):
// an `airlock` command exiting while its launcher thread was still binding libc died that way.
//
// One Int32 slot of a SharedArrayBuffer is the gate: IDLE, BUSY (the worker is in or about to enter
// native code) or CLOSED (the process is exiting). The worker enters with a compare-and-swap from
// IDLE, so it never starts native work once the main thread has closed the gate; the main thread
// closes it from a process 'exit' listener, which Node runs before it terminates workers, waiting
// (bounded) while the worker is busy.
const IDLE = 0;
const BUSY = 1;
const CLOSED = 2;

/** Worker side: mark the start of native work; false once the process is exiting (do nothing then). */
export function enterNative(gate: Int32Array, slot: number): boolean {
  return Atomics.compareExchange(gate, slot, IDLE, BUSY) === IDLE;
}

/** Worker side: native work is over; wakes a main thread waiting to close the gate. */
export function leaveNative(gate: Int32Array, slot: number): void {
  Atomics.compareExchange(gate, slot, BUSY, IDLE);
  Atomics.notify(gate, slot);
}

/**
 * Main-thread side, from a process 'exit' listener: close the gate once the worker is idle. Waits at
 * most `timeoutMs` (a worker stuck in a call must not hang the exit); true if the gate is closed.
 */
export function closeGate(gate: Int32Array, slot: number, timeoutMs: number): boolean {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const was = Atomics.compareExchange(gate, slot, IDLE, CLOSED);
    if (was !== BUSY) return true; // IDLE (closed now) or CLOSED already
    const left = deadline - Date.now();
    if (left <= 0) return false;
    Atomics.wait(gate, slot, BUSY, left);
  }
}
