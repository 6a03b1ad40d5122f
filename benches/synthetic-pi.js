// A synthetic Pi CLI for benchmarks: prints GIB GiB (default 1) of Pi 0.73-shaped `--mode json`
// events to stdout, as fast as it can, then agent_end. The stream repeats one block of events:
// an assistant message streamed as message_update lines that repeat the growing partial
// message (as Pi does), its message_end, a tool call's start/update/end, and turn_end.
// With LINE_MIB set, it first prints one message_end line of LINE_MIB MiB: a line the runner
// must hold whole to parse it (past the runner's caps, it is discarded).
'use strict';
const fs = require('fs');
const total = Math.floor(parseFloat(process.env.GIB || '1') * (1 << 30));

function put(buf) {
  let off = 0;
  while (off < buf.length) {
    try { off += fs.writeSync(1, buf, off, buf.length - off); }
    catch (e) { if (e.code !== 'EAGAIN') throw e; }
  }
}

const usage = { input: 120, output: 40, cacheRead: 0, cacheWrite: 0, totalTokens: 160,
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } };
const lines = [];
let text = '';
const word = 'lorem ipsum dolor sit amet, consectetur adipiscing elit. ';
for (let i = 0; i < 200; i++) {
  text += word;
  const partial = { role: 'assistant', content: [{ type: 'text', text }], api: 'openai-completions',
    provider: 'synthetic', model: 'bench', usage, stopReason: 'stop', timestamp: 1 };
  lines.push(JSON.stringify({ type: 'message_update',
    assistantMessageEvent: { type: 'text_delta', contentIndex: 0, delta: word, partial } }));
}
const final = { role: 'assistant', content: [{ type: 'text', text }], api: 'openai-completions',
  provider: 'synthetic', model: 'bench', usage, stopReason: 'toolUse', timestamp: 1 };
lines.push(JSON.stringify({ type: 'message_end', message: final }));
lines.push(JSON.stringify({ type: 'tool_execution_start', toolCallId: 'c', toolName: 'bash',
  args: { command: 'ls -la src/' } }));
lines.push(JSON.stringify({ type: 'tool_execution_update', toolCallId: 'c', toolName: 'bash',
  args: { command: 'ls -la src/' }, partialResult: { content: [{ type: 'text', text: 'main.rs\n' }] } }));
lines.push(JSON.stringify({ type: 'tool_execution_end', toolCallId: 'c', toolName: 'bash',
  result: { content: [{ type: 'text', text: 'main.rs\nlib.rs\n' }] }, isError: false }));
lines.push(JSON.stringify({ type: 'turn_end', message: final, toolResults: [] }));
const block = Buffer.from(lines.join('\n') + '\n');

put(Buffer.from(JSON.stringify({ type: 'session', version: 3, id: 'bench', cwd: process.cwd() }) + '\n'));
put(Buffer.from('{"type":"agent_start"}\n'));
const lineMiB = parseFloat(process.env.LINE_MIB || '0');
if (lineMiB > 0) {
  put(Buffer.from('{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"'));
  const chunk = Buffer.alloc(1 << 20, 'a');
  for (let i = 0; i < lineMiB; i++) put(chunk);
  put(Buffer.from('"}],"stopReason":"stop"}}\n'));
}
let written = 0;
while (written < total) { put(block); written += block.length; }
const last = { role: 'assistant', content: [{ type: 'text', text: 'done' }], usage, stopReason: 'stop' };
put(Buffer.from(JSON.stringify({ type: 'message_end', message: last }) + '\n'));
put(Buffer.from(JSON.stringify({ type: 'agent_end', messages: [] }) + '\n'));
