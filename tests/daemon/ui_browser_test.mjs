// ui_browser_test.mjs: ddtreed's web view (docs/ui.md) in a real browser: Debian's chromium
// driven by playwright-core (both installed by scripts/lib/web.sh; without them: exit 77,
// "skipped").
//
// One daemon on a loopback TCP port with a bearer token (so the login form and its cookie are
// exercised too) and max_parallel_runs 2; two runs of examples/tiny.json: "tiny" (made long, so
// it stays running) and a short one whose name is an HTML injection. The browser, with a fresh
// user data dir:
//   1 /ui sends it to the login form; the token logs it in (an HttpOnly, SameSite=Strict cookie)
//   2 the runs table shows tiny running, and the injected name as text (no <img>, no script ran)
//   3 tiny's page: its loss chart holds points; Pause -> paused, Resume -> running; a screenshot
//     (BUILD/ui/ui-run.png)
//   4 the compare view of both runs draws their loss
//   5 refused: a cross-origin POST (from a page of another origin, and with a foreign Origin),
//     a POST from a browser without the CSRF token, a DNS-rebound Host; none paused the run
//   6 a second daemon on a loopback port without a token: no "Log out"; a run that failed
//     before its first step (a GPU this node lacks) shows no "null" and every control disabled
// Also: "Log out" shows where the token is wanted, the runs table lists newest first with each
// run's id, ddtree.bytes prints the decimal units of tests/client (the same table), and the
// short run, completed, may be exported (its checkpoint) but not checkpointed.
// and no page logged a console error. Every wait is for a condition, with a generous deadline.
//
//   node ui_browser_test.mjs --ddtreed PATH --web-dir build-web --examples DIR --out BUILD/ui
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";

const SKIP = 77, DEADLINE_MS = 60000, TOKEN = "ui-test-token-93b1";
const CHROMIUM = process.env.DDTREE_CHROMIUM || "/usr/bin/chromium";
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"];
const INJECTION = '<img src=x onerror="window.__pwned=1">';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
for (const k of ["ddtreed", "web-dir", "examples", "out"])
  if (!args[k]) {
    console.error("usage: node ui_browser_test.mjs --ddtreed PATH --web-dir DIR --examples DIR --out DIR");
    process.exit(2);
  }

let playwright;
try {
  if (!fs.existsSync(CHROMIUM)) throw new Error(`no ${CHROMIUM}`);
  playwright = createRequire(path.join(path.resolve(args["web-dir"]), "package.json"))("playwright-core");
} catch (e) {
  console.log(`SKIPPED: ${e.message.split("\n")[0]} (install chromium and the npm packages of web/: ` +
              "source scripts/lib/common.sh and scripts/lib/web.sh, then ddtree_web_install)");
  process.exit(SKIP);
}

const started = Date.now();
const timings = [];
const failures = [];
let phaseStart = Date.now();
function phase(name) {
  timings.push(`${name} ${((Date.now() - phaseStart) / 1000).toFixed(1)} s`);
  phaseStart = Date.now();
}
function check(ok, what) {
  if (!ok) failures.push(what);
  return ok;
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

async function until(what, fn, ms = DEADLINE_MS) {
  const end = Date.now() + ms;
  for (;;) {
    try { const v = await fn(); if (v) return v; } catch (e) { /* not yet */ }
    if (Date.now() > end) throw new Error(`gave up waiting: ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

// ---- the daemon ----------------------------------------------------------------------------

const out = path.resolve(args.out);
fs.rmSync(out, { recursive: true, force: true });
const state = path.join(out, "state");
fs.mkdirSync(state, { recursive: true });
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
fs.writeFileSync(path.join(out, "ddtreed.json"),
                 JSON.stringify({ listen: `127.0.0.1:${port}`, token: TOKEN, max_parallel_runs: 2 }));
const log = fs.openSync(path.join(out, "ddtreed.log"), "w");
const daemon = spawn(args.ddtreed, ["serve", "--config", path.join(out, "ddtreed.json"), "--state-dir", state,
                                    "--socket", path.join(state, "api.sock")], { stdio: ["ignore", log, log] });
let exited = null;
daemon.on("exit", (code, signal) => { exited = { code, signal }; });
// the second one: no token (its pages want no login, so they offer no "Log out")
const state2 = path.join(out, "state2");
fs.mkdirSync(state2, { recursive: true });
const port2 = await freePort();
const base2 = `http://127.0.0.1:${port2}`;
fs.writeFileSync(path.join(out, "ddtreed2.json"), JSON.stringify({ listen: `127.0.0.1:${port2}` }));
const log2 = fs.openSync(path.join(out, "ddtreed2.log"), "w");
const daemon2 = spawn(args.ddtreed, ["serve", "--config", path.join(out, "ddtreed2.json"), "--state-dir", state2,
                                     "--socket", path.join(state2, "api.sock")], { stdio: ["ignore", log2, log2] });
let exited2 = null;
daemon2.on("exit", (code, signal) => { exited2 = { code, signal }; });

async function call(method, p, body, headers = {}) {
  const r = await fetch(base + p, {
    method, headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json", ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) { /* the status says it */ }
  return { status: r.status, json, text };
}

/* GET p with a Host header of our choosing (fetch drops a given Host) */
function getWithHost(p, host) {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port, path: p, headers: { Host: host, Authorization: `Bearer ${TOKEN}` } },
      (res) => {
        let text = "";
        res.on("data", (d) => { text += d; });
        res.on("end", () => { let json = null; try { json = JSON.parse(text); } catch (e) { /* status */ } resolve({ status: res.statusCode, json, text }); });
      });
    req.on("error", reject);
  });
}

let browser = null;
try {
  await until("ddtreed answering GET /healthz", async () => {
    if (exited) throw new Error(`ddtreed exited ${JSON.stringify(exited)}: see ${out}/ddtreed.log`);
    return (await call("GET", "/healthz")).status === 200;
  });
  const tiny = JSON.parse(fs.readFileSync(path.join(args.examples, "tiny.json"), "utf8"));
  const long = { ...tiny, train: { ...tiny.train, steps: 100000 } };
  const short = { ...tiny, name: INJECTION, train: { ...tiny.train, steps: 30 } };
  const a = await call("POST", "/runs", long), b = await call("POST", "/runs", short);
  if (a.status !== 201 || b.status !== 201) throw new Error(`POST /runs: ${a.text} ${b.text}`);
  const idA = a.json.id, idB = b.json.id;
  await until("the second ddtreed answering GET /healthz", async () => {
    if (exited2) throw new Error(`the second ddtreed exited ${JSON.stringify(exited2)}: see ${out}/ddtreed2.log`);
    return (await fetch(`${base2}/healthz`)).status === 200;
  });
  const gpuless = { ...tiny, name: "gpu-less", devices: ["cuda:15"] };
  const f = await fetch(`${base2}/runs`, { method: "POST", headers: { "Content-Type": "application/json" },
                                           body: JSON.stringify(gpuless) });
  if (f.status !== 201) throw new Error(`POST /runs (second daemon): ${await f.text()}`);
  const idF = (await f.json()).id;
  phase("daemon and runs");

  // ---- the browser -------------------------------------------------------------------------

  const profile = fs.mkdtempSync(path.join(out, "chromium-"));
  browser = await playwright.chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, args: FLAGS, viewport: { width: 1400, height: 1800 },
  });
  const consoleErrors = [];
  const page = await browser.newPage();
  page.on("dialog", (d) => d.accept());
  page.setDefaultTimeout(DEADLINE_MS);

  // 1 login
  await page.goto(`${base}/ui`);
  check(page.url() === `${base}/ui/login`, `GET /ui without a session went to ${page.url()}, not the login form`);
  await page.fill("#token", "not-the-token");
  await page.click("button[type=submit]");
  await page.waitForFunction(() => document.getElementById("message")?.textContent.includes("not the daemon's token"));
  await page.fill("#token", TOKEN);
  await Promise.all([page.waitForURL(`${base}/ui`), page.click("button[type=submit]")]);
  const cookie = (await browser.cookies(base)).find((c) => c.name === "ddtree_session");
  check(cookie && cookie.httpOnly && cookie.sameSite === "Strict",
        `the session cookie is not HttpOnly + SameSite=Strict: ${JSON.stringify(cookie)}`);
  check(await page.isVisible("#logout"), "no \"Log out\" on a listener that wants the token");
  // from here on (the wrong token's 401 above is logged by the browser, as it should be)
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(`${page.url()}: ${m.text()}`); });
  page.on("pageerror", (e) => consoleErrors.push(`${page.url()}: ${e.message}`));
  phase("login");

  // 2 the runs table, the injected name
  await page.waitForSelector(`#runs tr[data-id="${idA}"][data-state="running"]`);
  await page.waitForSelector(`#runs tr[data-id="${idB}"]`);
  const shownName = await page.textContent(`#runs tr[data-id="${idB}"] .run-name`);
  check(shownName === INJECTION, `the injected run name shows as ${JSON.stringify(shownName)}, not as its text`);
  check(await page.locator("#runs img").count() === 0, "the injected name made an <img> in the runs table");
  check(await page.evaluate(() => window.__pwned === undefined), "the injected name's script ran");
  const order = await page.$$eval("#runs tbody tr", (rows) => rows.map((r) => r.dataset.id));
  check(order.join() === [idB, idA].join(), `the runs table is not newest first: ${order}, want ${[idB, idA]}`);
  const shownId = await page.textContent(`#runs tr[data-id="${idA}"] .run-id`);
  check(shownId === idA, `the runs table shows ${JSON.stringify(shownId)} as tiny's id, not ${idA}`);
  // the same table as tests/client/test_client.c's ddc_fmt_bytes cases: one convention, decimal
  const BYTES = [[999, "999 B"], [406700, "406.7 kB"], [10100000, "10.1 MB"], [25280000000, "25.28 GB"],
                 [0, "0 B"], [1000, "1.0 kB"], [1048576, "1.0 MB"], [423566, "423.6 kB"],
                 [149000000000, "149.00 GB"]];
  const formatted = await page.evaluate((vs) => vs.map((v) => ddtree.bytes(v)), BYTES.map((x) => x[0]));
  check(formatted.join("|") === BYTES.map((x) => x[1]).join("|"),
        `ddtree.bytes: ${formatted.join(", ")}, want ${BYTES.map((x) => x[1]).join(", ")}`);
  phase("runs table");

  // 3 the run page: loss points, pause, resume, screenshot
  await Promise.all([page.waitForURL(`${base}/ui/runs/${idA}`), page.click(`#runs tr[data-id="${idA}"] .run-name`)]);
  await page.waitForFunction(() => Number(document.querySelector('[data-chart="loss"]')?.dataset.points) > 0);
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "running");
  await page.click('button[data-action="pause"]');
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "paused");
  check((await call("GET", `/runs/${idA}`)).json.state === "paused", "the page showed paused, the API does not");
  await page.click('button[data-action="resume"]');
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "running");
  // enough steps for a screenshot worth showing (docs/ui-run.png)
  await page.waitForFunction(() => Number(document.querySelector('[data-chart="loss"]')?.dataset.points) >= 60);
  await page.waitForFunction(() => document.querySelectorAll("#events tbody tr").length > 0 &&
                                   document.querySelectorAll("#plan tbody tr").length > 0 &&
                                   Number(document.querySelector('[data-chart="tau"]')?.dataset.points) > 0);
  await page.screenshot({ path: path.join(out, "ui-run.png"), fullPage: false });
  phase("run page, pause and resume");

  // the injected name on its own page
  await page.goto(`${base}/ui/runs/${idB}`);
  await page.waitForFunction((n) => document.getElementById("run-name").textContent === n, INJECTION);
  check(await page.locator("h1 img").count() === 0, "the injected name made an <img> on its run page");
  // completed: no worker, a checkpoint: Export (from it) but no Checkpoint, Pause or Cancel
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "completed");
  const doneControls = await page.$$eval("[data-action]", (bs) => Object.fromEntries(bs.map((b) => [b.dataset.action, b.disabled])));
  check(!doneControls.export && doneControls.checkpoint && doneControls.pause && doneControls.cancel && doneControls.rechunk,
        `the completed run's controls (disabled): ${JSON.stringify(doneControls)}`);

  // 4 compare
  await page.goto(`${base}/ui`);
  await page.check(`#runs tr[data-id="${idA}"] input[type=checkbox]`);
  await page.check(`#runs tr[data-id="${idB}"] input[type=checkbox]`);
  await Promise.all([page.waitForURL(/\/ui\/compare\?runs=/), page.click("#compare")]);
  await page.waitForFunction(() => document.querySelectorAll("#compared li").length === 2 &&
                                   Number(document.querySelector('[data-chart="loss"]')?.dataset.points) > 0);
  check(await page.locator("#compared img").count() === 0, "the injected name made an <img> in the compare view");
  phase("compare view");

  // 5 refusals: nothing may pause tiny
  const evil = await browser.newPage();
  await evil.route("http://evil.test/**", (route) => route.fulfill({
    contentType: "text/html",
    body: `<form id="f" method="post" action="${base}/runs/${idA}/pause"></form><script>
      fetch("${base}/runs/${idA}/pause", {method: "POST", mode: "no-cors", credentials: "include"})
        .finally(() => document.getElementById("f").submit());</script>`,
  }));
  await evil.goto("http://evil.test/");
  await until("the foreign page's form post", () => evil.url().startsWith(base));
  const formAnswer = await evil.textContent("body");
  check(/cross_origin|unauthorized/.test(formAnswer), `a cross-origin form post was answered ${formAnswer}`);
  await evil.close();
  let r = await call("POST", `/runs/${idA}/pause`, undefined, { Origin: "http://evil.test" });
  check(r.status === 403 && r.json.error.code === "cross_origin", `a POST with a foreign Origin: ${r.status} ${r.text}`);
  r = await page.evaluate(async (p) => (await fetch(p, { method: "POST" })).status, `/runs/${idA}/pause`);
  check(r === 403, `a POST from the page without the CSRF token: ${r}`);
  r = await getWithHost("/runs", `rebound.example:${port}`);
  check(r.status === 403 && r.json.error.code === "forbidden_host", `a DNS-rebound Host: ${r.status} ${r.text}`);
  const events = (await call("GET", `/runs/${idA}/events?limit=10000`)).json.events;
  const pauses = events.filter((e) => e.kind === "state" && e.detail.state === "paused").length;
  check(pauses === 1, `tiny was paused ${pauses} times, only the page's pause may have paused it`);
  phase("refusals");

  // 6 the second daemon: no token, no "Log out"; a failed run without a step or a checkpoint
  await page.goto(`${base2}/ui`);
  await page.waitForSelector(`#runs tr[data-id="${idF}"][data-state="failed"]`);
  check(!(await page.isVisible("#logout")), "\"Log out\" on a listener without a token");
  await page.goto(`${base2}/ui/runs/${idF}`);
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "failed");
  const summary = await page.textContent("#summary");
  check(!/null|undefined|NaN/.test(summary), `the failed run's summary says ${JSON.stringify(summary)}`);
  check(!(await page.isVisible("#logout")), "\"Log out\" on a run page of a listener without a token");
  const failedControls = await page.$$eval("[data-action]", (bs) => bs.filter((b) => !b.disabled).map((b) => b.dataset.action));
  check(failedControls.length === 0, `the failed run (no worker, no checkpoint) offers ${failedControls}`);
  const exportAnswer = await fetch(`${base2}/runs/${idF}/export`, { method: "POST" });
  check(exportAnswer.status === 409, `POST export of the failed run: ${exportAnswer.status}, the page's rule says 409`);
  phase("no token, a failed run");

  // the page's fetch without a token above logs a 403: the one console error that is expected
  const unexpected = consoleErrors.filter((m) => !m.includes("403"));
  check(unexpected.length === 0, `console errors: ${unexpected.join(" | ")}`);
} catch (e) {
  failures.push(e.stack || String(e));
} finally {
  if (browser) await browser.close();
  for (const d of fs.readdirSync(out)) if (d.startsWith("chromium-")) fs.rmSync(path.join(out, d), { recursive: true, force: true });
  daemon.kill("SIGTERM");
  daemon2.kill("SIGTERM");
  await until("ddtreed stopping", () => exited, 120000).catch((e) => { failures.push(e.message); daemon.kill("SIGKILL"); });
  if (exited && exited.code !== 0) failures.push(`ddtreed exited ${JSON.stringify(exited)} (see ${out}/ddtreed.log)`);
  await until("the second ddtreed stopping", () => exited2, 120000).catch((e) => { failures.push(e.message); daemon2.kill("SIGKILL"); });
  if (exited2 && exited2.code !== 0) failures.push(`the second ddtreed exited ${JSON.stringify(exited2)} (see ${out}/ddtreed2.log)`);
}

console.log(`timings: ${timings.join(", ")}; total ${((Date.now() - started) / 1000).toFixed(1)} s`);
if (failures.length) {
  for (const f of failures) console.log(`FAIL ${f}`);
  console.log(`daemon log: ${out}/ddtreed.log`);
  process.exit(1);
}
console.log(`ok: the web view in chromium; screenshot ${out}/ui-run.png`);
