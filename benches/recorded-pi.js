// A fake Pi CLI for benches/peers.sh: prints a short recorded Pi 0.73 `--mode json` stream (a
// session header, one assistant message, agent_end) and exits 0. Given BENCH_MARK=FILE it first
// writes the epoch time in ms at which its process started (performance.timeOrigin, fractional)
// to FILE, so the bench can tell when the child started; given BENCH_IDLE_S=N it then waits N
// seconds before the stream ends (an idle Pi, waiting on its model).
'use strict';
const fs = require('fs');
const { performance } = require('perf_hooks');
if (process.env.BENCH_MARK) {
  fs.writeFileSync(process.env.BENCH_MARK, String(performance.timeOrigin));
}
const msg = { role: 'assistant', content: [{ type: 'text', text: 'done' }], stopReason: 'stop',
  usage: { input: 1, output: 2, cacheRead: 0, cacheWrite: 0, totalTokens: 3 } };
const put = (e) => process.stdout.write(JSON.stringify(e) + '\n');
put({ type: 'session', version: 3, id: 'bench', cwd: process.cwd() });
put({ type: 'agent_start' });
const end = () => {
  put({ type: 'message_end', message: msg });
  put({ type: 'turn_end', message: {} });
  put({ type: 'agent_end', messages: [msg] });
};
const idle = parseFloat(process.env.BENCH_IDLE_S || '0');
if (idle > 0) setTimeout(end, idle * 1000); else end();
