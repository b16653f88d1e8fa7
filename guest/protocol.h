// The agent's frame format (mirrored by src/backends/microvm/protocol.ts; see docs/microvm.md).
// Every frame: a 12-byte header, then `length` payload bytes.
//   u32 length (little-endian, payload only) | u8 type | 3 bytes zero | u32 id (little-endian)
// `id` names the exec (or the file request) a frame belongs to; 0 for HELLO.
#ifndef AIRLOCK_AGENT_PROTOCOL_H
#define AIRLOCK_AGENT_PROTOCOL_H

#define AGENT_VERSION "airlock-agent/2"
#define AGENT_PORT_NAME "airlock.agent"
#define AGENT_HEADER_BYTES 12
/** Largest payload either side sends (host->guest stdin chunks and file writes are split below it). */
#define AGENT_MAX_PAYLOAD (1024 * 1024)
#define AGENT_MAX_FILE_BYTES (1024 * 1024 - 64)
#define AGENT_MAX_STRINGS 4096
/** stdin bytes an exec may hold unread before its stdin is closed. */
#define AGENT_MAX_STDIN_BUFFER (16 * 1024 * 1024)

enum frame_type {
  FR_HELLO = 1,       // guest: payload = AGENT_VERSION
  FR_EXEC = 2,        // host: see do_exec
  FR_STARTED = 3,     // guest: u32 pid, u64 oom kills, u64 pids.max hits (the sandbox's, at start)
  FR_STDOUT = 4,      // guest: bytes
  FR_STDERR = 5,      // guest: bytes
  FR_STDIN = 6,       // host: bytes
  FR_STDIN_EOF = 7,   // host: empty
  FR_EXIT = 8,        // guest: i32 code (-1 if signalled), u32 signal (0 if exited), then the
                      // counters as in STARTED, read once every process of the exec is gone
  FR_KILL = 9,        // host: u32 signal, to every process of the exec
  FR_ERROR = 10,      // guest: message (the request `id` failed)
  FR_FILE_READ = 11,  // host: path NUL
  FR_FILE_DATA = 12,  // guest: the file's bytes
  FR_FILE_WRITE = 13, // host: u32 mode, path NUL, bytes
  FR_OK = 14,         // guest: empty (a FILE_WRITE succeeded)
  FR_SHUTDOWN = 15,   // host: empty; the guest kills everything, syncs and powers off
  FR_IDENTITY = 16,   // host: this sandbox's identity (see do_identity); guest answers OK or ERROR
};

/** IDENTITY payload: u64 wall-clock seconds, u32 nanoseconds, u32 pids.max, u64 memory.max, 32
 *  seed bytes, then the hostname (1-64 bytes) NUL-terminated, nothing after. */
#define AGENT_IDENTITY_FIXED 56
#define AGENT_SEED_BYTES 32
#define AGENT_MAX_HOSTNAME 64

#endif
