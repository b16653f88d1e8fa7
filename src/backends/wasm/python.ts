// The Python side of a WASM sandbox's worker: a small module (`_airlock`) installed in Pyodide once,
// that runs a script the way `python -c`/`python file` would (exit codes from SystemExit, tracebacks
// on stderr) and a runCode cell the way a Jupyter kernel would (the last expression's value, the
// error as { name, value, traceback }). Its own frames are cut from every traceback.
export const PYTHON_HELPER = String.raw`
import sys, os, json, traceback, builtins
from pyodide.code import eval_code

_contexts = {}

def _set_env(env, cwd):
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)

def _cut(e, keep):
    # Drop the frames above the user's code (this module's, eval_code's) from the traceback.
    tb = e.__traceback__
    while tb is not None and not keep(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return e.with_traceback(tb)

def _main_frame(filename):
    return filename != '<airlock>'

def run_main(code, filename, argv, env, cwd):
    """Run code as __main__; returns the exit status (SystemExit n -> n, an uncaught error -> 1)."""
    _set_env(env, cwd)
    sys.argv = list(argv)
    g = {'__name__': '__main__', '__builtins__': builtins}
    if filename != '<string>':
        g['__file__'] = filename
    try:
        exec(compile(code, filename, 'exec'), g)
        return 0
    except SystemExit as e:
        c = e.code
        if c is None:
            return 0
        if isinstance(c, int):
            return c & 0xFF
        print(c, file=sys.stderr)
        return 1
    except MemoryError:
        traceback.print_exception(_cut(sys.exc_info()[1], _main_frame))
        return -2
    except BaseException as e:
        traceback.print_exception(_cut(e, _main_frame))
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()

def _results(value):
    if value is None:
        return None
    r = {'text': repr(value), 'isMainResult': True}
    if isinstance(value, (dict, list, tuple, int, float, bool, str)):
        try:
            r['json'] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            pass
    return r

def run_cell(code, context_id, env):
    """Run one runCode cell in a context; returns (result dict or None, error dict or None, oom)."""
    _set_env(env, None)
    g = _contexts.get(context_id)
    if g is None:
        g = {'__name__': '__main__', '__builtins__': builtins}
        if context_id is not None:
            _contexts[context_id] = g
    try:
        value = eval_code(code, g, return_mode='last_expr', filename='<cell>')
        return (_results(value), None, False)
    except BaseException as e:
        e = _cut(e, lambda f: f == '<cell>')
        err = {
            'name': type(e).__name__,
            'value': str(e),
            'traceback': ''.join(traceback.format_exception(e)),
        }
        return (None, err, isinstance(e, MemoryError))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()

def close_context(context_id):
    _contexts.pop(context_id, None)
`;
