// The front server's Prometheus metrics (issue 36): one registry per server (no prom-client global),
// served at /metrics. Live sandboxes are read from the store when scraped; the rest are counted as
// requests pass through TenantScopedApi (and the MCP mount, which increments mcpCalls).
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { EgressEvent } from '../egress/events.js';

export interface ServerMetrics {
  readonly registry: Registry;
  readonly creates: Counter<'outcome'>;
  readonly execSeconds: Histogram;
  readonly egressVerdicts: Counter<'decision'>;
  readonly mcpCalls: Counter<'tenant' | 'server' | 'outcome'>;
  egress(e: EgressEvent): void;
}

export function serverMetrics(o: {
  liveSandboxes: () => number;
  queuedCreates: () => number;
  supervisorUp: () => boolean;
}): ServerMetrics {
  const registry = new Registry();
  new Gauge({
    name: 'airlock_live_sandboxes',
    help: 'Sandboxes running or paused (all tenants)',
    registers: [registry],
    collect() {
      this.set(o.liveSandboxes());
    },
  });
  new Gauge({
    name: 'airlock_queued_creates',
    help: 'Creates waiting for quota',
    registers: [registry],
    collect() {
      this.set(o.queuedCreates());
    },
  });
  new Gauge({
    name: 'airlock_supervisor_up',
    help: '1 when the supervisor answered the last check',
    registers: [registry],
    collect() {
      this.set(o.supervisorUp() ? 1 : 0);
    },
  });
  const creates = new Counter({
    name: 'airlock_creates_total',
    help: 'Sandbox creates by outcome (ok, error, quota)',
    labelNames: ['outcome'] as const,
    registers: [registry],
  });
  const execSeconds = new Histogram({
    name: 'airlock_exec_seconds',
    help: 'Foreground exec time, request to exit',
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [registry],
  });
  const egressVerdicts = new Counter({
    name: 'airlock_egress_verdicts_total',
    help: 'Egress attempts seen on egress streams, by decision',
    labelNames: ['decision'] as const,
    registers: [registry],
  });
  const mcpCalls = new Counter({
    name: 'airlock_mcp_calls_total',
    help: 'MCP tool calls through /mcp, by tenant, configured server and outcome (allowed, denied, error)',
    labelNames: ['tenant', 'server', 'outcome'] as const,
    registers: [registry],
  });
  return {
    registry,
    creates,
    execSeconds,
    egressVerdicts,
    mcpCalls,
    egress: (e) => egressVerdicts.inc({ decision: e.decision }),
  };
}
