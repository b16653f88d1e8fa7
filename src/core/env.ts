// The environment every sandbox starts from, whatever the backend: no host value ever, only these
// defaults, then what the runtime adds (egress proxy variables, sentinels), spec.env and exec env.

export const SANDBOX_HOME = '/home/user';

export function defaultEnv(): Record<string, string> {
  return {
    PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
    HOME: SANDBOX_HOME,
    USER: 'user',
    LANG: 'C.UTF-8',
  };
}
