# Airlock's Python kernel (src/sandbox/code/kernel.ts starts it inside the sandbox as
# `python3 -u -c SRC`). It runs cells against one globals dict, so variables, imports and functions
# persist from one cell to the next.
#
# Protocol (src/sandbox/code/protocol.ts): the host writes one JSON request per line on stdin,
# {"id", "code", "envs"}. The cell's own output goes to the real stdout/stderr (fd 1/2, inherited by
# its subprocesses) as raw data. Control frames travel in-band on stdout as
#   \x1e\x1eAL:<id>:<json>\n
# where <id> is the request's random id: output that does not carry the current id is data. A run
# ends with an {"t":"end"} frame on stdout and the line \x1e\x1eAL:<id>:end on stderr, so the host
# knows both streams are complete. The cell's stdin is /dev/null (it cannot read the requests).
# The cell runs in this process: it can lie about its own results, nothing more (the host treats
# every frame as data, never as code).
import ast
import base64
import io
import json
import linecache
import os
import sys
import traceback

_cmd = os.fdopen(os.dup(0), 'rb')  # os.dup: not inherited by subprocesses
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(os.devnull, 'r')

os.environ.setdefault('MPLBACKEND', 'Agg')
# Debian keeps matplotlibrc in /etc, which a sandbox's root may not have: use the packaged copy.
if ('MATPLOTLIBRC' not in os.environ and not os.path.exists('/etc/matplotlibrc')
        and os.path.exists('/usr/share/matplotlib/mpl-data/matplotlibrc')):
    os.environ['MATPLOTLIBRC'] = '/usr/share/matplotlib/mpl-data/matplotlibrc'
if 'MPLCONFIGDIR' not in os.environ:
    import tempfile
    os.environ['MPLCONFIGDIR'] = os.path.join(tempfile.gettempdir(), 'airlock-matplotlib')

_run_id = None
_cell_no = 0
_globals = {'__name__': '__main__', '__builtins__': __builtins__}


def _write_all(fd, data):
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _frame(obj):
    sys.stdout.flush()
    sys.stderr.flush()
    line = '\x1e\x1eAL:%s:%s\n' % (_run_id, json.dumps(obj, ensure_ascii=True, default=str))
    _write_all(1, line.encode('ascii'))


def _reprs(value, main):
    out = {'t': 'result', 'isMainResult': main}
    for meth, key in (('_repr_html_', 'html'), ('_repr_svg_', 'svg'),
                      ('_repr_png_', 'png'), ('_repr_json_', 'json')):
        try:
            f = getattr(value, meth, None)
            if isinstance(value, type) or not callable(f):
                continue
            r = f()
        except Exception:
            continue
        if r is None:
            continue
        if key == 'png' and isinstance(r, (bytes, bytearray)):
            r = base64.b64encode(r).decode('ascii')
        out[key] = r
    if 'png' not in out and type(value).__name__ == 'Figure' and hasattr(value, 'savefig'):
        try:
            buf = io.BytesIO()
            value.savefig(buf, format='png')
            out['png'] = base64.b64encode(buf.getvalue()).decode('ascii')
        except Exception:
            pass
    try:
        out['text'] = repr(value)
    except Exception as e:  # a broken __repr__ is the cell's error, not the kernel's
        out['text'] = '<repr failed: %s: %s>' % (type(e).__name__, e)
    return out


def display(obj):
    """Show obj as a result of the cell (as a notebook's display())."""
    _frame(_reprs(obj, False))


_globals['display'] = display


def _figures():
    plt = sys.modules.get('matplotlib.pyplot')
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            buf = io.BytesIO()
            plt.figure(num).savefig(buf, format='png')
            _frame({'t': 'result', 'isMainResult': False, 'text': '<Figure %d>' % num,
                    'png': base64.b64encode(buf.getvalue()).decode('ascii')})
        plt.close('all')
    except Exception:
        traceback.print_exc()


def _error(e, filename):
    tb = e.__traceback__
    # Drop the kernel's own frames: the traceback starts at the cell.
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    text = ''.join(traceback.format_exception(type(e), e, tb))
    _frame({'t': 'error', 'name': type(e).__name__, 'value': str(e), 'traceback': text})


def _run(code):
    global _cell_no
    _cell_no += 1
    filename = '<cell-%d>' % _cell_no
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, 'exec')
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, 'exec'), _globals)
        if last is not None:
            value = eval(compile(last, filename, 'eval'), _globals)
            if value is not None:
                _globals['_'] = value
                _frame(_reprs(value, True))
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: the kernel lives on
        _error(e, filename)
    _figures()


def _main():
    global _run_id
    while True:
        line = _cmd.readline()
        if not line:
            return
        req = json.loads(line)
        _run_id = req['id']
        envs = req.get('envs') or {}
        saved = {k: os.environ.get(k) for k in envs}
        os.environ.update(envs)
        try:
            _run(req['code'])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _frame({'t': 'end'})
        _write_all(2, ('\x1e\x1eAL:%s:end\n' % _run_id).encode('ascii'))


_main()
