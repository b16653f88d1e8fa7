// SECURITY-RELEVANT: the rules on Python code, read from the syntax tree with the light data flow of
// flow.ts. Names are resolved through imports and aliases (`import subprocess as sp`, `from os import
// system as s`, `__import__('os')`, `getattr(os, 'sys' + 'tem')`, `globals()['ex' + 'ec']`), so a
// call is judged by what it calls, not by how it is spelled; strings and comments are never read as
// code. What is not followed: values through function parameters and returns, attributes of objects,
// containers after they are built, and code generated at run time other than by the shapes below.
import type { Node } from 'web-tree-sitter';
import {
  Env,
  UNKNOWN,
  UNKNOWN_VAL,
  carry,
  has,
  join,
  kids,
  lit,
  withTaint,
  type Sink,
  type Taint,
  type Val,
} from './flow.js';
import { INTERPRETERS, SHELLS, ipMatch, isBlockDevice, isDestructiveTarget, pathMatch } from './patterns.js';
import { TAINT_BY_NAME, callResult, pyRef, unescapePython } from './python-calls.js';
import {
  argvOf,
  DANGEROUS_MODULES,
  DESERIALIZERS,
  EXEC,
  LIBC_TAMPER,
  NETWORK_PREFIXES,
  SHELL_STRING,
  SUBPROCESS,
  isDangerous,
  normalise,
  DECODERS,
  PROPAGATORS,
  IGNORE_ENVDUMP,
} from './python-names.js';

export function analyzePython(root: Node, sink: Sink): void {
  const env = new Env();
  const star: string[] = [];
  const memo = new Map<number, Val>();

  const bindName = (name: string, v: Val): void => env.set(name, v);

  const bind = (target: Node | null, v: Val): void => {
    if (!target) return;
    switch (target.type) {
      case 'identifier':
        bindName(target.text, v);
        break;
      case 'pattern_list':
      case 'tuple_pattern':
      case 'list_pattern':
      case 'tuple':
      case 'list':
      case 'as_pattern_target':
        for (const c of kids(target)) bind(c, { ...carry(v), items: undefined });
        break;
      case 'list_splat_pattern':
        bind(target.firstNamedChild, carry(v));
        break;
    }
  };

  const ev = (n: Node | null): Val => {
    if (!n) return UNKNOWN_VAL;
    const known = memo.get(n.id);
    if (known) return known;
    const v = evalNode(n);
    memo.set(n.id, v);
    return v;
  };

  const stringVal = (n: Node): Val => {
    const prefix = n.firstChild?.type === 'string_start' ? n.firstChild.text.toLowerCase() : '';
    const raw = prefix.includes('r');
    const parts: Val[] = [];
    for (const c of kids(n)) {
      if (c.type === 'string_content') parts.push(lit(raw ? c.text : unescapePython(c.text)));
      else if (c.type === 'interpolation') parts.push(ev(c.childForFieldName('expression')));
    }
    return join(parts);
  };

  const refVal = pyRef;

  const evalNode = (n: Node): Val => {
    switch (n.type) {
      case 'string':
        return stringVal(n);
      case 'concatenated_string':
        return join(kids(n).map(ev));
      case 'integer':
      case 'float':
      case 'true':
      case 'false':
      case 'none':
        return lit(n.text);
      case 'identifier': {
        const name = n.text;
        const v = env.get(name);
        if (v) return v;
        for (const m of star) {
          const q = normalise(`${m}.${name}`);
          if (isDangerous(q) || DECODERS.has(q) || q in TAINT_BY_NAME) return refVal(q);
        }
        return refVal(name === '__builtins__' ? 'builtins' : name);
      }
      case 'attribute': {
        const obj = ev(n.childForFieldName('object'));
        const attr = n.childForFieldName('attribute')?.text ?? '';
        if (obj.ref)
          return refVal(`${obj.ref}.${attr}`, {
            taint: new Set([...obj.taint, ...(TAINT_BY_NAME[normalise(`${obj.ref}.${attr}`)] ?? [])]),
            hidden: obj.hidden,
          });
        return carry(obj);
      }
      case 'subscript':
        return subscript(n);
      case 'call':
        return call(n);
      case 'parenthesized_expression':
      case 'await':
      case 'expression_statement':
      case 'list_splat':
      case 'dictionary_splat':
        return ev(n.firstNamedChild);
      case 'binary_operator': {
        const l = ev(n.childForFieldName('left'));
        const r = ev(n.childForFieldName('right'));
        const op = n.childForFieldName('operator')?.text;
        if (op === '+') return join([l, r]);
        if (op === '/') return join([l, r], '/');
        if (op === '%' && l.literal) {
          return {
            text: l.text.replace(/%[-+ #0-9.]*[sdrifxXoeEgGc]/g, UNKNOWN),
            literal: l.literal && r.literal,
            taint: new Set([...l.taint, ...r.taint]),
          };
        }
        return carry(l, r);
      }
      case 'boolean_operator':
      case 'conditional_expression': {
        const vs = kids(n).map(ev);
        return { ...carry(...vs), text: vs[0]?.text ?? UNKNOWN, literal: vs.every((v) => v.literal) };
      }
      case 'list':
      case 'tuple':
      case 'set':
      case 'expression_list': {
        const items = kids(n).map(ev);
        return { text: UNKNOWN, literal: items.every((i) => i.literal), taint: carry(...items).taint, items };
      }
      case 'dictionary': {
        const props = new Map<string, Val>();
        const vals: Val[] = [];
        for (const p of kids(n)) {
          if (p.type === 'pair') {
            const key = ev(p.childForFieldName('key')).text;
            if (/^LD_(?:PRELOAD|AUDIT)$/.test(key)) sink.report('process-tamper', p);
            const v = ev(p.childForFieldName('value'));
            props.set(key, v);
            vals.push(v);
          } else vals.push(ev(p));
        }
        return { ...carry(...vals), props };
      }
      case 'list_comprehension':
      case 'set_comprehension':
      case 'generator_expression':
      case 'dictionary_comprehension': {
        const vals: Val[] = [];
        for (const c of kids(n)) {
          if (c.type === 'for_in_clause') {
            const it = ev(c.childForFieldName('right'));
            vals.push(it);
            bind(c.childForFieldName('left'), carry(it));
          }
        }
        for (const c of kids(n)) if (c.type !== 'for_in_clause' && c.type !== 'if_clause') vals.push(ev(c));
        return carry(...vals);
      }
      default:
        return UNKNOWN_VAL;
    }
  };

  const subscript = (n: Node): Val => {
    const obj = ev(n.childForFieldName('value'));
    const keyNode = n.childForFieldName('subscript');
    const key = ev(keyNode);
    if (keyNode?.type === 'slice' && keyNode.text.replace(/\s/g, '') === '::-1') {
      return withTaint(carry(obj), 'decoded'); // s[::-1]: reversed text
    }
    if (
      obj.ref === 'globals()' ||
      obj.ref === 'builtins.__dict__' ||
      obj.ref === 'builtins' ||
      obj.ref === 'sys.modules'
    ) {
      if (key.literal) {
        const q = normalise(key.text);
        if (obj.ref !== 'sys.modules' && isDangerous(q)) sink.report('obfuscated-exec', n);
        return refVal(q, { hidden: obj.ref !== 'sys.modules' });
      }
      // sys.modules[name] only finds what is already imported: a lookup, not a hidden import.
      if (obj.ref !== 'sys.modules' || has(key, 'decoded', 'charcode')) {
        sink.report(has(key, 'decoded', 'charcode') ? 'obfuscated-exec' : 'dynamic-import', n);
      }
      return UNKNOWN_VAL;
    }
    if (obj.ref === 'os.environ' || obj.ref === 'os.environb') {
      return { text: key.text === 'HOME' ? '~' : UNKNOWN, literal: false, taint: new Set<Taint>(['env']) };
    }
    if (obj.items && /^\d+$/.test(key.text) && obj.items[Number(key.text)])
      return obj.items[Number(key.text)]!;
    const t = carry(obj);
    (t.taint as Set<Taint>).delete('envdump');
    return t;
  };

  const call = (n: Node): Val => {
    const fn = n.childForFieldName('function');
    const argsNode = n.childForFieldName('arguments');
    const callee = ev(fn);
    const q = callee.ref ? normalise(callee.ref) : undefined;
    const receiver = fn?.type === 'attribute' ? ev(fn.childForFieldName('object')) : undefined;
    const method = fn?.type === 'attribute' ? (fn.childForFieldName('attribute')?.text ?? '') : undefined;
    const pos: Val[] = [];
    const posNodes: Node[] = [];
    const kw = new Map<string, { node: Node; val: Val }>();
    for (const a of argsNode ? kids(argsNode) : []) {
      if (a.type === 'keyword_argument') {
        const name = a.childForFieldName('name')?.text ?? '';
        const valueNode = a.childForFieldName('value');
        if (/^LD_(?:PRELOAD|AUDIT)$/.test(name)) sink.report('process-tamper', a);
        if (valueNode) kw.set(name, { node: valueNode, val: ev(valueNode) });
      } else if (a.type !== 'comment') {
        pos.push(ev(a));
        posNodes.push(a);
      }
    }
    if (argsNode?.type === 'generator_expression') pos.push(ev(argsNode));
    const all = [...pos, ...[...kw.values()].map((k) => k.val)];

    checkCall(n, q, callee, receiver, method, pos, posNodes, kw, all);
    return callResult(q, receiver, method, pos, all);
  };

  /** The rules that look at one call. */
  const checkCall = (
    n: Node,
    q: string | undefined,
    callee: Val,
    receiver: Val | undefined,
    method: string | undefined,
    pos: Val[],
    posNodes: Node[],
    kw: Map<string, { node: Node; val: Val }>,
    all: Val[],
  ): void => {
    const arg0 =
      pos[0] ?? kw.get('args')?.val ?? kw.get('cmd')?.val ?? kw.get('source')?.val ?? kw.get('object')?.val;
    if (q && callee.hidden && isDangerous(q)) sink.report('obfuscated-exec', n);

    if (q && EXEC.has(q) && arg0) {
      const escapes =
        posNodes[0]
          ?.descendantsOfType('escape_sequence')
          .filter((e) => e && /^\\(?:x|u|U|[0-7])/.test(e.text)).length ?? 0;
      if (has(arg0, 'decoded', 'charcode') || escapes >= 4) sink.report('obfuscated-exec', n);
      else if (has(arg0, 'network', 'file', 'input', 'env')) sink.report('eval-untrusted', n);
      else if (arg0.literal) sink.code(arg0.text, n);
    }
    if (q && DESERIALIZERS.has(q) && arg0 && has(arg0, 'network', 'input')) {
      const loader = kw.get('Loader')?.node.text ?? (pos[1] ? '' : undefined);
      if (!(q === 'yaml.load' && loader !== undefined && /Safe|Base/.test(loader)))
        sink.report('eval-untrusted', n);
    }

    const shellString = (v: Val): void => {
      if (has(v, 'decoded', 'charcode')) sink.report('obfuscated-exec', n);
      else if (v.literal) sink.shell(v.text, n);
      else if (has(v, 'network', 'file') && v.text === UNKNOWN) sink.report('eval-untrusted', n);
      else sink.report('shell-injection', n);
    };
    const runArgv = (items: readonly Val[]): void => {
      const texts = items.map((i) => (i.literal ? i.text : null));
      const prog = (texts[0] ?? '').replace(/^.*\//, '');
      const at = texts.findIndex((t) => t !== null && /^-[a-z]*[ce]$/.test(t));
      const script = at > 0 ? items[at + 1] : undefined;
      if (
        script &&
        (SHELLS.has(prog) || INTERPRETERS.has(prog)) &&
        has(script, 'decoded', 'charcode', 'network', 'file')
      ) {
        sink.report(has(script, 'decoded', 'charcode') ? 'obfuscated-exec' : 'eval-untrusted', n);
      } else sink.argv(texts, n);
    };
    if (q && SHELL_STRING.has(q) && arg0) shellString(arg0);
    if (q && SUBPROCESS.has(q)) {
      const shellKw = kw.get('shell')?.node;
      const shell = shellKw !== undefined && !/^(?:False|None|0)$/.test(shellKw.text);
      const argv = argvOf(q, pos, arg0);
      if (shell && arg0) {
        if (arg0.items) runArgv(arg0.items);
        else shellString(arg0);
      } else if (argv) runArgv(argv);
      else if (arg0?.literal) sink.shell(arg0.text, n);
    }

    // __import__ / importlib of a computed name (a literal package prefix constrains it: not reported).
    if (
      q &&
      (q === '__import__' || q === 'importlib.import_module' || q === 'importlib.__import__') &&
      arg0 &&
      !arg0.literal
    ) {
      if (has(arg0, 'decoded', 'charcode')) sink.report('obfuscated-exec', n);
      else if (!/^[A-Za-z_][\w.]*\./.test(arg0.text)) sink.report('dynamic-import', n);
    }
    if (q === 'getattr' && pos.length >= 2) {
      const obj = pos[0]!;
      const name = pos[1]!;
      const root = obj.ref?.split('.')[0];
      if (root && DANGEROUS_MODULES.has(root)) {
        if (name.literal) {
          if (isDangerous(normalise(`${obj.ref}.${name.text}`))) sink.report('obfuscated-exec', n);
        } else sink.report(has(name, 'decoded', 'charcode') ? 'obfuscated-exec' : 'dynamic-import', n);
      }
    }

    // ptrace, raw syscalls and namespace calls through a libc handle or os.
    if (
      method &&
      (/^(?:ptrace|process_vm_(?:writev|readv))$/.test(method) ||
        (has(receiver, 'libc') && LIBC_TAMPER.test(method)))
    ) {
      sink.report(
        /^(?:init_module|finit_module|bpf)$/.test(method) ? 'sandbox-escape-probe' : 'process-tamper',
        n,
      );
    }
    if (q === 'os.unshare' || q === 'os.setns') sink.report('process-tamper', n);
    if (q && /^shutil\.rmtree$|^os\.removedirs$/.test(q) && arg0 && isDestructiveTarget(arg0.text))
      sink.report('destructive-fs', n);
    if ((q === 'open' || q === 'io.open' || q === 'os.open') && arg0 && isBlockDevice(arg0.text))
      sink.report('destructive-fs', n);
    if (q === 'os.putenv' && arg0 && /^LD_(?:PRELOAD|AUDIT)$/.test(arg0.text))
      sink.report('process-tamper', n);

    // Literal IPs: any URL-shaped argument of any call, and host arguments of network calls.
    const network =
      (q !== undefined && NETWORK_PREFIXES.some((p) => q.startsWith(p))) ||
      (method !== undefined &&
        has(receiver, 'network') &&
        /^(?:get|post|put|patch|delete|head|request|open|urlopen|connect|connect_ex|sendto|send|create_connection|ws_connect)$/.test(
          method,
        ));
    for (const v of all) {
      for (const candidate of [v, ...(v.items ?? []).slice(0, 1)]) {
        if (!(network || /^[a-z][a-z0-9+.-]*:\/\//i.test(candidate.text))) continue;
        const m = ipMatch(candidate.text);
        if (m) sink.report(m.rule, n, m.severity);
      }
    }

    // The whole environment handed to anything but a copy (env=… of a child process is fine).
    const envDumped =
      pos.some((v) => has(v, 'envdump')) ||
      [...kw.entries()].some(([k, v]) => k !== 'env' && has(v.val, 'envdump'));
    if (envDumped && !(q && (PROPAGATORS.has(q) || IGNORE_ENVDUMP.test(q))) && !has(receiver, 'envdump')) {
      sink.report('credential-read', n, 'medium');
    }
  };

  const visitChildren = (n: Node): void => {
    for (const c of kids(n)) visit(c);
  };

  const checkPath = (v: Val, at: Node): void => {
    const m = pathMatch(v.text);
    if (m) sink.report(m.rule, at, m.severity);
  };

  const visit = (n: Node): void => {
    switch (n.type) {
      case 'comment':
        return;
      case 'import_statement':
        for (const c of kids(n)) {
          if (c.type === 'dotted_name') bindName(c.text.split('.')[0]!, refVal(c.text.split('.')[0]!));
          else if (c.type === 'aliased_import') {
            bindName(
              c.childForFieldName('alias')?.text ?? '',
              refVal(c.childForFieldName('name')?.text ?? ''),
            );
          }
        }
        return;
      case 'import_from_statement': {
        const mod = n.childForFieldName('module_name')?.text ?? '';
        for (const c of n.childrenForFieldName('name')) {
          if (!c) continue;
          if (c.type === 'dotted_name') bindName(c.text, refVal(`${mod}.${c.text}`));
          else if (c.type === 'aliased_import') {
            bindName(
              c.childForFieldName('alias')?.text ?? '',
              refVal(`${mod}.${c.childForFieldName('name')?.text ?? ''}`),
            );
          }
        }
        if (kids(n).some((c) => c.type === 'wildcard_import')) star.push(mod);
        return;
      }
      case 'assignment': {
        const right = n.childForFieldName('right');
        if (right) visit(right);
        const v = right ? ev(right) : UNKNOWN_VAL;
        const left = n.childForFieldName('left');
        if (right && right.type !== 'string') checkPath(v, right);
        if (left?.type === 'subscript') {
          const key = ev(left.childForFieldName('subscript'));
          if (/^LD_(?:PRELOAD|AUDIT)$/.test(key.text)) sink.report('process-tamper', n);
        }
        bind(left, v);
        if (left && left.type !== 'identifier') visit(left);
        return;
      }
      case 'augmented_assignment': {
        const right = n.childForFieldName('right');
        if (right) visit(right);
        const left = n.childForFieldName('left');
        if (left?.type === 'identifier')
          bindName(left.text, join([env.get(left.text) ?? UNKNOWN_VAL, ev(right)]));
        return;
      }
      case 'for_statement': {
        const right = n.childForFieldName('right');
        if (right) visit(right);
        bind(n.childForFieldName('left'), carry(ev(right)));
        for (const c of kids(n)) if (c.id !== right?.id && c.id !== n.childForFieldName('left')?.id) visit(c);
        return;
      }
      case 'as_pattern': {
        const value = n.firstNamedChild;
        if (value) visit(value);
        bind(n.childForFieldName('alias'), ev(value));
        return;
      }
      case 'function_definition':
      case 'class_definition':
        bindName(n.childForFieldName('name')?.text ?? '', UNKNOWN_VAL);
        visit(n.childForFieldName('body') ?? n);
        return;
      case 'call': {
        ev(n);
        const args = n.childForFieldName('arguments');
        for (const a of args ? kids(args) : []) {
          const value = a.type === 'keyword_argument' ? a.childForFieldName('value') : a;
          // A plain variable's path was reported where it was built (its assignment).
          if (value && value.type !== 'string' && value.type !== 'identifier') checkPath(ev(value), value);
        }
        visitChildren(n);
        return;
      }
      case 'subscript':
      case 'attribute':
        ev(n);
        visitChildren(n);
        return;
      case 'string': {
        const v = ev(n);
        checkPath(v, n);
        visitChildren(n);
        return;
      }
    }
    visitChildren(n);
  };

  visit(root);
}
