// The messages between the fd relay's two threads (relay.privileged.ts on the main thread,
// relay-worker.privileged.ts in the worker): what the worker is started with, the commands it takes
// and the message it sends when a tunnel ends. Types only.
import type { MessagePort } from 'node:worker_threads';

export interface RelayInit {
  /** Commands come in on it; the worker reads them when the eventfd wakes it. */
  readonly port: MessagePort;
  readonly eventFd: number;
  /** Two Int32 slots: [0] the stop flag, [1] the native gate (core/native-gate.ts). */
  readonly stop: SharedArrayBuffer;
  /** struct epoll_event: 12 bytes, data at 4 on x86_64 (packed); 16 bytes, data at 8 elsewhere. */
  readonly epollEventSize: number;
  readonly epollDataOffset: number;
  /** The most one read takes while the pending bytes of all tunnels are under budgetBytes. */
  readonly bigReadBytes: number;
  /** The most one read takes beyond that budget. */
  readonly smallReadBytes: number;
  readonly budgetBytes: number;
}

export type Command =
  | {
      readonly op: 'add';
      readonly id: number;
      /** client, upstream */
      readonly fds: readonly number[];
      readonly upPrefix: Uint8Array;
      readonly downPrefix: Uint8Array;
      readonly idleMs: number;
    }
  | {
      readonly op: 'copy';
      readonly id: number;
      /** from (read), to (written, never shut down) */
      readonly fds: readonly number[];
      /** Written to `to` first (counted in bytesDown). */
      readonly prefix: Uint8Array;
      /** Then exactly this many bytes from `from`; EOF earlier is an error ('truncated'). */
      readonly bytes: number;
      readonly idleMs: number;
    }
  | { readonly op: 'close'; readonly id: number };

export interface EndMessage {
  readonly op: 'end';
  readonly id: number;
  readonly bytesUp: number;
  readonly bytesDown: number;
  readonly error?: string;
}
