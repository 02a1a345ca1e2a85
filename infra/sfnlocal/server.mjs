// server.mjs: a local Step Functions endpoint for one state machine, for tests (lib/sfn/sfntest starts it).
//
//   node server.mjs --definition ASL.json [--sub NAME=VALUE]... --lambda FUNCTION=URL... \
//        [--host 127.0.0.1] [--port 0] [--name jobs] [--region us-east-1] [--account 000000000000] \
//        [--lambda-grace-ms 1000] [--verbose]
//
// It speaks the Step Functions API's AWS JSON 1.0 protocol (POST /, X-Amz-Target: AWSStepFunctions.<Op>, JSON
// body) for StartExecution, DescribeExecution, ListExecutions, StopExecution and DescribeStateMachine, and runs
// each execution with aws-local-stepfunctions (the definition is validated by it, with ARN and path checks).
// ${NAME} placeholders in the definition (SAM's DefinitionSubstitutions) are replaced by the --sub values first;
// one left unreplaced is a start-up error.
//
// Task states: every Lambda task, "Resource": "arn:aws:states:::lambda:invoke" with Parameters.FunctionName, or a
// Lambda function ARN as the Resource, is bound to the callback URL given for its function by --lambda (matched
// by the full ARN, else by the function's name). An unbound Lambda task is a start-up error. A task attempt POSTs
// the function's event (the integration's Payload) to the URL, which answers like the Lambda Invoke API:
//   - 200 with the function's JSON result;
//   - 200 with header X-Amz-Function-Error and the runtime's error document {"errorMessage", "errorType", ...}:
//     the task fails with Error = errorType (what Retry and Catch ErrorEquals match: aws-local-stepfunctions
//     compares ErrorEquals entries with the thrown error's `name`) and Cause = the document as text, as Step
//     Functions reports a Lambda function error;
//   - 429: Lambda.TooManyRequestsException; other 5xx: Lambda.ServiceException; another status:
//     Lambda.AWSLambdaException; no answer at all: Lambda.SdkClientException (the Lambda service errors the
//     state machine retries).
// The lambda:invoke integration's result is {"ExecutedVersion", "Payload", "StatusCode"}, so OutputPath
// "$.Payload" behaves as in AWS. The interpreter enforces TimeoutSeconds itself (it races each attempt against a
// timer and fails it with States.Timeout); the callback's request is aborted lambda-grace-ms after that, so a
// handler that honours its context stops soon after, like a Lambda reaching its own timeout.
//
// Executions follow AWS's naming rules: a name is 1-80 characters without whitespace, brackets, wildcards or
// "#%\^|~`$&,;:/ (InvalidName); a name already used answers 400 ExecutionAlreadyExists, except while the
// execution of that name is still running with the very same input, which AWS (and this server) answers with
// success and the same executionArn. Statuses: RUNNING, SUCCEEDED, FAILED (error and cause from the failing
// state), TIMED_OUT (the definition's TimeoutSeconds), ABORTED (StopExecution).
//
// On start it prints one JSON line to stdout, {"endpoint": ..., "stateMachineArn": ...}, once it listens
// (--port 0, the default, takes a free port). --verbose logs each interpreter event to stderr.

import { readFileSync } from 'node:fs';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { StateMachine, ExecutionTimeoutError, ExecutionAbortedError, ExecutionError } from 'aws-local-stepfunctions';

const LAMBDA_INVOKE = 'arn:aws:states:::lambda:invoke';
const DEFAULT_TASK_TIMEOUT_SECONDS = 60; // aws-local-stepfunctions' default when a Task has no TimeoutSeconds
const MAX_INPUT_BYTES = 256 * 1024;

function fail(msg) {
  process.stderr.write(`sfnlocal: ${msg}\n`);
  process.exit(2);
}

const { values: opts } = parseArgs({
  options: {
    definition: { type: 'string' },
    sub: { type: 'string', multiple: true, default: [] },
    lambda: { type: 'string', multiple: true, default: [] },
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: '0' },
    name: { type: 'string', default: 'jobs' },
    region: { type: 'string', default: 'us-east-1' },
    account: { type: 'string', default: '000000000000' },
    'lambda-grace-ms': { type: 'string', default: '1000' },
    verbose: { type: 'boolean', default: false },
  },
});
if (!opts.definition) fail('--definition is required');

function pairs(list, flag) {
  const m = new Map();
  for (const p of list) {
    const i = p.indexOf('=');
    if (i <= 0) fail(`${flag} ${p}: want NAME=VALUE`);
    m.set(p.slice(0, i), p.slice(i + 1));
  }
  return m;
}
const subs = pairs(opts.sub, '--sub');
const lambdas = pairs(opts.lambda, '--lambda');
const graceMs = Number(opts['lambda-grace-ms']);

// ${NAME} substitution, as SAM's DefinitionSubstitutions does it (on the text, before parsing).
let text = readFileSync(opts.definition, 'utf8').replace(/\$\{([A-Za-z0-9_]+)\}/g, (m, name) => {
  if (!subs.has(name)) fail(`${opts.definition}: no --sub for \${${name}}`);
  return subs.get(name);
});
let definition;
try {
  definition = JSON.parse(text);
} catch (e) {
  fail(`${opts.definition}: ${e.message}`);
}

const stateMachineArn = `arn:aws:states:${opts.region}:${opts.account}:stateMachine:${opts.name}`;
const executionArn = (name) => `arn:aws:states:${opts.region}:${opts.account}:execution:${opts.name}:${name}`;

// functionName reduces a function ARN or name (possibly qualified) to the bare name.
function functionName(ref) {
  const m = /^arn:[^:]+:lambda:[^:]*:[^:]*:function:([^:]+)/.exec(ref);
  return m ? m[1] : ref.split(':')[0];
}

function callbackFor(ref) {
  if (lambdas.has(ref)) return lambdas.get(ref);
  const name = functionName(ref);
  for (const [k, url] of lambdas) if (functionName(k) === name) return url;
  return undefined;
}

function taskError(name, message) {
  const e = new Error(message);
  e.name = name;
  return e;
}

// invoke POSTs one event to a callback and answers as the Lambda service would.
async function invoke(url, event, timeoutMs) {
  let res, body;
  try {
    res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(event),
      signal: AbortSignal.timeout(timeoutMs + graceMs),
    });
    body = await res.text();
  } catch (e) {
    throw taskError('Lambda.SdkClientException', `Unable to execute HTTP request: ${e.message}`);
  }
  if (res.status === 429) throw taskError('Lambda.TooManyRequestsException', body || 'Rate Exceeded.');
  if (res.status >= 500) throw taskError('Lambda.ServiceException', body || `status ${res.status}`);
  if (res.status !== 200) throw taskError('Lambda.AWSLambdaException', body || `status ${res.status}`);
  if (res.headers.get('x-amz-function-error')) {
    let doc;
    try {
      doc = JSON.parse(body);
    } catch {
      doc = undefined;
    }
    throw taskError(typeof doc?.errorType === 'string' && doc.errorType ? doc.errorType : 'Lambda.Unknown', body);
  }
  try {
    return body === '' ? null : JSON.parse(body);
  } catch (e) {
    throw taskError('Lambda.AWSLambdaException', `the function's result is not JSON: ${e.message}`);
  }
}

// Bind every Lambda task (nested Parallel branches and Map processors included) to its callback.
const handlers = {};
(function bind(states) {
  for (const [name, state] of Object.entries(states ?? {})) {
    for (const branch of state.Branches ?? []) bind(branch.States);
    bind((state.ItemProcessor ?? state.Iterator)?.States);
    if (state.Type !== 'Task') continue;
    const integrated = state.Resource === LAMBDA_INVOKE;
    const ref = integrated ? state.Parameters?.FunctionName : state.Resource;
    if (!integrated && !/^arn:[^:]+:lambda:/.test(ref ?? '')) fail(`task ${name}: resource ${ref} is not a Lambda function`);
    if (typeof ref !== 'string') fail(`task ${name}: lambda:invoke without a literal Parameters.FunctionName`);
    const url = callbackFor(ref);
    if (!url) fail(`task ${name}: no --lambda for function ${ref}`);
    const timeoutMs = (state.TimeoutSeconds ?? DEFAULT_TASK_TIMEOUT_SECONDS) * 1000;
    handlers[name] = integrated
      ? async (input) => ({ ExecutedVersion: '$LATEST', Payload: await invoke(url, input?.Payload ?? null, timeoutMs), StatusCode: 200 })
      : (input) => invoke(url, input, timeoutMs);
  }
})(definition.States);

let machine;
try {
  machine = new StateMachine(definition, { validationOptions: { checkArn: true, checkPaths: true } });
} catch (e) {
  fail(e.message);
}

/** @type {Map<string, {name: string, arn: string, input: string, status: string, startDate: number, stopDate?: number, output?: string, error?: string, cause?: string, abort: () => void}>} */
const executions = new Map();
const now = () => Date.now() / 1000;

class APIError extends Error {
  constructor(type, message, status = 400) {
    super(message);
    this.type = type;
    this.status = status;
  }
}

function validName(name) {
  // AWS: 1-80 characters; no whitespace, brackets < > { } [ ], wildcards ? *, special characters " # % \ ^ | ~ ` $ & , ; : /,
  // or control characters.
  return typeof name === 'string' && name.length >= 1 && name.length <= 80 &&
    !/[\s<>{}[\]?*"#%\\^|~`$&,;:/\u0000-\u001f\u007f-\u009f]/u.test(name);
}

function lookup(arn) {
  const name = typeof arn === 'string' && arn.startsWith(executionArn('')) ? arn.slice(executionArn('').length) : undefined;
  const ex = name === undefined ? undefined : executions.get(name);
  if (!ex) throw new APIError('ExecutionDoesNotExist', `Execution Does Not Exist: '${arn}'`);
  return ex;
}

function checkMachine(arn) {
  if (arn !== stateMachineArn) throw new APIError('StateMachineDoesNotExist', `State Machine Does Not Exist: '${arn}'`);
}

function log(...args) {
  if (opts.verbose) process.stderr.write(args.join(' ') + '\n');
}

async function drain(name, events) {
  for await (const ev of events) {
    log(name, ev.type, ev.state?.name ?? '', ev.Error ?? '', ev.Cause ?? '', ev.retry ? `retry#${ev.retry.attempt}` : '');
  }
}

function startExecution(req) {
  checkMachine(req.stateMachineArn);
  const name = req.name ?? randomUUID();
  if (!validName(name)) throw new APIError('InvalidName', `Invalid Name: '${name}'`);
  const input = req.input ?? '{}';
  if (Buffer.byteLength(input) > MAX_INPUT_BYTES) throw new APIError('InvalidExecutionInput', 'Input is too large');
  let value;
  try {
    value = JSON.parse(input);
  } catch (e) {
    throw new APIError('InvalidExecutionInput', `Invalid State Machine Execution Input: '${e.message}'`);
  }
  const arn = executionArn(name);
  const prior = executions.get(name);
  if (prior) {
    if (prior.status === 'RUNNING' && prior.input === input) return { executionArn: arn, startDate: prior.startDate };
    throw new APIError('ExecutionAlreadyExists', `Execution Already Exists: '${arn}'`);
  }
  const startDate = now();
  const run = machine.run(value, {
    overrides: { taskResourceLocalHandlers: handlers },
    context: { Execution: { Id: arn, Name: name, RoleArn: `arn:aws:iam::${opts.account}:role/sfnlocal` }, StateMachine: { Id: stateMachineArn, Name: opts.name } },
  });
  const ex = { name, arn, input, status: 'RUNNING', startDate, abort: run.abort };
  executions.set(name, ex);
  drain(name, run.eventLogs).catch((e) => log(name, 'event log:', e.message));
  run.result.then(
    (output) => {
      if (ex.status !== 'RUNNING') return;
      Object.assign(ex, { status: 'SUCCEEDED', stopDate: now(), output: JSON.stringify(output ?? null) });
    },
    (err) => {
      if (ex.status !== 'RUNNING') return;
      ex.stopDate = now();
      if (err instanceof ExecutionTimeoutError) {
        Object.assign(ex, { status: 'TIMED_OUT', error: 'States.Timeout', cause: 'The execution timed out (TimeoutSeconds).' });
      } else if (err instanceof ExecutionAbortedError) {
        ex.status = 'ABORTED';
      } else {
        const cause = err instanceof ExecutionError && err.cause instanceof Error ? err.cause : err;
        Object.assign(ex, { status: 'FAILED', error: cause?.name ?? 'States.Runtime', cause: cause?.message ?? String(err) });
      }
      log(name, ex.status, ex.error ?? '', ex.cause ?? '');
    },
  );
  return { executionArn: arn, startDate };
}

function describe(ex) {
  const out = { executionArn: ex.arn, stateMachineArn, name: ex.name, status: ex.status, startDate: ex.startDate, input: ex.input };
  for (const k of ['stopDate', 'output', 'error', 'cause']) if (ex[k] !== undefined) out[k] = ex[k];
  return out;
}

const ops = {
  StartExecution: startExecution,
  DescribeExecution: (req) => describe(lookup(req.executionArn)),
  ListExecutions: (req) => {
    checkMachine(req.stateMachineArn);
    const list = [...executions.values()]
      .filter((ex) => !req.statusFilter || ex.status === req.statusFilter)
      .sort((a, b) => b.startDate - a.startDate)
      .map(({ arn, name, status, startDate, stopDate }) => ({ executionArn: arn, stateMachineArn, name, status, startDate, ...(stopDate ? { stopDate } : {}) }));
    return { executions: list };
  },
  StopExecution: (req) => {
    const ex = lookup(req.executionArn);
    if (ex.status === 'RUNNING') {
      Object.assign(ex, { status: 'ABORTED', stopDate: now(), error: req.error, cause: req.cause });
      ex.abort();
    }
    return { stopDate: ex.stopDate };
  },
  DescribeStateMachine: (req) => {
    checkMachine(req.stateMachineArn);
    return { stateMachineArn, name: opts.name, status: 'ACTIVE', definition: text, roleArn: `arn:aws:iam::${opts.account}:role/sfnlocal`, type: 'STANDARD', creationDate: started };
  },
};
const started = now();

function reply(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/x-amz-json-1.0', 'content-length': Buffer.byteLength(data), 'x-amzn-requestid': randomUUID() });
  res.end(data);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    try {
      if (req.method !== 'POST') throw new APIError('UnknownOperationException', 'POST / only');
      const target = req.headers['x-amz-target'] ?? '';
      const op = target.startsWith('AWSStepFunctions.') ? ops[target.slice('AWSStepFunctions.'.length)] : undefined;
      if (!op) throw new APIError('UnknownOperationException', `unknown operation ${target}`);
      let body;
      try {
        body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : {};
      } catch {
        throw new APIError('SerializationException', 'the body is not JSON');
      }
      reply(res, 200, op(body ?? {}));
    } catch (e) {
      if (e instanceof APIError) reply(res, e.status, { __type: e.type, message: e.message });
      else reply(res, 500, { __type: 'InternalFailure', message: e.message });
    }
  });
});
server.listen(Number(opts.port), opts.host, () => {
  const { port } = server.address();
  process.stdout.write(JSON.stringify({ endpoint: `http://${opts.host}:${port}`, stateMachineArn }) + '\n');
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
