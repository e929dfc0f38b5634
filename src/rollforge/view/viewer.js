"use strict";
// rollforge run viewer: everything runs from the embedded data; nothing is fetched.
(function () {
  const $ = (id) => document.getElementById(id);
  const S = JSON.parse($("rf-summary").textContent);
  const C = Object.fromEntries(S.columns.map((name, i) => [name, i]));
  const ROWS = S.rows;
  const PAGE = 50;
  const training = S.kind === "training";
  const chunkNodes = document.getElementsByClassName("rf-chunk");
  const chunks = new Map();
  let vocab = null;
  let shown = ROWS;
  let page = 0;
  let selected = null;

  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  const fmt = (x) => (x === null || x === undefined ? "–" : Number.isInteger(x) ? String(x) : Number(x).toFixed(3));

  async function unpack(b64) {
    const text = atob(b64);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  async function detailOf(i) {
    const n = Math.floor(i / S.chunk);
    if (!chunks.has(n)) chunks.set(n, unpack(chunkNodes[n].textContent));
    const vocabNode = $("rf-vocab");
    if (vocab === null && vocabNode) vocab = await unpack(vocabNode.textContent);
    return (await chunks.get(n))[i % S.chunk];
  }

  // -- header -------------------------------------------------------------------------------
  $("run-title").textContent = S.title;
  $("run-kind").textContent = `${S.kind} run · ${ROWS.length} episodes` + (S.tokenizer ? ` · tokens: ${S.tokenizer}` : " · tokens shown as ids") +
    (S.interrupted ? ` · interrupted: the episodes written to ${S.interrupted}` : "");
  // every figure, in the order header.py chose (headline first, each environment's, then the rest)
  $("run-metrics").innerHTML = S.header.map(([k, v]) => `<span>${esc(k)} <b>${fmt(v)}</b></span>`).join("");

  // -- training: curve and per-step table ----------------------------------------------------
  if (training) {
    $("training").hidden = false;
    drawCurve();
    const steps = new Map();
    for (const r of ROWS) {
      const s = steps.get(r[C.step]) || { n: 0, sum: 0, errors: 0 };
      s.n += 1; s.sum += r[C.reward] || 0; s.errors += r[C.error] ? 1 : 0;
      steps.set(r[C.step], s);
    }
    $("steps").innerHTML = "<tr><th>step</th><th>episodes</th><th>mean reward</th><th>errors</th></tr>" +
      [...steps].map(([step, s]) => `<tr data-step="${step}"><td>${step}</td><td>${s.n}</td><td>${fmt(s.sum / s.n)}</td><td>${s.errors}</td></tr>`).join("");
    $("steps").addEventListener("click", (e) => {
      const tr = e.target.closest("tr[data-step]");
      if (tr) { $("f-step").value = tr.dataset.step; applyFilters(); }
    });
  }

  function drawCurve() {
    const curve = S.curve.filter((m) => typeof m.step === "number");
    if (curve.length) {
      const main = curve.some((m) => "reward/mean" in m) ? "reward/mean" : "loss";
      $("curve").innerHTML = plot(curve, [main, ...Object.keys(curve[0]).filter((k) => k.startsWith("reward/env/"))], `${main} per step`);
    }
    const held = S.held_out || [];
    if (held.length > 1) {
      const tasks = [...new Set(held.flatMap((m) => Object.keys(m).filter((k) => k !== "step" && k !== "mean")))];
      $("held-out").innerHTML = `<h3>Held-out greedy reward</h3>` + plot(held, ["mean", ...tasks], "held-out greedy reward per step");
    }
  }

  function plot(rows, keys, label) {
    const W = 720, H = 190, L = 46, R = 150, T = 10, B = 24;
    const xs = rows.map((m) => m.step);
    const values = keys.flatMap((k) => rows.map((m) => m[k]).filter((v) => typeof v === "number"));
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...values), y1 = Math.max(...values);
    const x = (v) => L + ((v - x0) / (x1 - x0 || 1)) * (W - L - R);
    const y = (v) => H - B - ((v - y0) / (y1 - y0 || 1)) * (H - T - B);
    const colors = ["#1f5fbf", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"];
    let svg = `<svg width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(label)}">`;
    svg += `<line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/><line class="axis" x1="${L}" y1="${T}" x2="${L}" y2="${H - B}"/>`;
    svg += `<text x="${L - 4}" y="${y(y1) + 4}" text-anchor="end">${fmt(y1)}</text><text x="${L - 4}" y="${y(y0)}" text-anchor="end">${fmt(y0)}</text>`;
    svg += `<text x="${L}" y="${H - 8}">step ${x0}</text><text x="${W - R}" y="${H - 8}" text-anchor="end">${x1}</text>`;
    keys.forEach((k, i) => {
      const pts = rows.filter((m) => typeof m[k] === "number").map((m) => `${x(m.step).toFixed(1)},${y(m[k]).toFixed(1)}`);
      const color = colors[i % colors.length];
      svg += `<polyline class="series" data-key="${esc(k)}" fill="none" stroke="${color}" stroke-width="${i ? 1 : 2}" points="${pts.join(" ")}"/>`;
      svg += `<text x="${W - R + 8}" y="${T + 12 + 14 * i}" fill="${color}" style="fill:${color}">${esc(k.replace("reward/env/", ""))}</text>`;
    });
    return svg + "</svg>";
  }

  // -- filters ------------------------------------------------------------------------------
  function options(select, values, label = (v) => v) {
    select.insertAdjacentHTML("beforeend", values.map((v) => `<option value="${esc(v)}">${esc(label(v))}</option>`).join(""));
  }
  const uniq = (values) => [...new Set(values)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  options($("f-task"), uniq(ROWS.map((r) => r[C.task])));
  if (training) options($("f-step"), uniq(ROWS.map((r) => r[C.step])).map(String));
  else $("f-step").parentElement.hidden = true;
  options($("f-end"), uniq(ROWS.map((r) => r[C.end])));
  const errorKinds = uniq(ROWS.map((r) => r[C.error]).filter(Boolean));
  const failureKinds = uniq(ROWS.flatMap((r) => r[C.failures]));
  options($("f-error"), ["none", "any-error", ...errorKinds.map((k) => "error:" + k), ...failureKinds.map((k) => "failure:" + k)],
    (v) => (v === "none" ? "no error" : v === "any-error" ? "any error" : v.replace(":", ": ")));

  function applyFilters(keepPage) {
    const task = $("f-task").value, step = $("f-step").value, end = $("f-end").value, err = $("f-error").value;
    const lo = $("f-min").value === "" ? -Infinity : Number($("f-min").value);
    const hi = $("f-max").value === "" ? Infinity : Number($("f-max").value);
    shown = ROWS.filter((r) => {
      if (task && r[C.task] !== task) return false;
      if (step && String(r[C.step]) !== step) return false;
      if (end && r[C.end] !== end) return false;
      const reward = r[C.reward] === null ? NaN : r[C.reward];
      if ((lo > -Infinity || hi < Infinity) && !(reward >= lo && reward <= hi)) return false;
      if (err === "none" && r[C.error]) return false;
      if (err === "any-error" && !r[C.error]) return false;
      if (err.startsWith("error:") && r[C.error] !== err.slice(6)) return false;
      if (err.startsWith("failure:") && !r[C.failures].includes(err.slice(8))) return false;
      return true;
    });
    if (!keepPage) page = 0;
    renderList();
  }
  for (const id of ["f-task", "f-step", "f-end", "f-error"]) $(id).addEventListener("change", () => applyFilters());
  for (const id of ["f-min", "f-max"]) $(id).addEventListener("input", () => applyFilters());

  // -- list -----------------------------------------------------------------------------------
  const head = ["#", ...(training ? ["step"] : []), "env", "reward", ...(training ? ["adv"] : []), "turns", "ending", "error / failures", "tokens"];
  $("episodes").tHead.innerHTML = "<tr>" + head.map((h) => `<th>${h}</th>`).join("") + "</tr>";
  function renderList() {
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    page = Math.min(page, pages - 1);
    $("count").textContent = `${shown.length} of ${ROWS.length} episodes`;
    $("page").textContent = `page ${page + 1} of ${pages}`;
    $("prev").disabled = page === 0;
    $("next").disabled = page >= pages - 1;
    $("episodes").tBodies[0].innerHTML = shown.slice(page * PAGE, (page + 1) * PAGE).map((r) => {
      const problems = [r[C.error] ? `<span class="err">${esc(r[C.error])}</span>` : "", ...r[C.failures].map(esc)].filter(Boolean).join(", ");
      return `<tr data-i="${r[C.i]}"${r[C.i] === selected ? ' class="selected"' : ""}><td class="num">${r[C.i]}</td>` +
        (training ? `<td class="num">${r[C.step]}</td>` : "") +
        `<td>${esc(r[C.task])}</td><td class="num">${fmt(r[C.reward])}</td>` +
        (training ? `<td class="num">${fmt(r[C.adv])}</td>` : "") +
        `<td class="num">${r[C.turns]}</td><td>${esc(r[C.end])}</td><td>${problems}</td><td class="num">${r[C.policy]}/${r[C.tokens]}</td></tr>`;
    }).join("");
  }
  $("prev").addEventListener("click", () => { page -= 1; renderList(); });
  $("next").addEventListener("click", () => { page += 1; renderList(); });
  $("episodes").tBodies[0].addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-i]");
    if (tr) open(Number(tr.dataset.i));
  });

  // -- one episode ------------------------------------------------------------------------------
  async function open(i) {
    selected = i;
    for (const tr of $("episodes").tBodies[0].rows) tr.classList.toggle("selected", Number(tr.dataset.i) === i);
    const r = ROWS[i];
    const d = await detailOf(i);
    if (selected !== i) return;
    let turn = 0;
    const messages = d.messages.map((m) => {
      const reward = m.role === "assistant" && turn < d.rewards.length ? `<span class="turn-reward">turn ${turn + 1} reward ${fmt(d.rewards[turn++])}</span>` : "";
      const calls = m.calls.map((c) => c.error
        ? `<div class="call bad">invalid tool call: ${esc(c.error)}</div>`
        : `<div class="call">&#9881; ${esc(c.name)}(${esc(JSON.stringify(c.arguments))})</div>`).join("");
      const name = m.name ? ` · ${esc(m.name)}` : "";
      const images = m.images.length ? ` · ${m.images.length} image(s)` : "";
      return `<div class="msg ${esc(m.role)}">${reward}<span class="role">${esc(m.role)}${name}${images}</span>${pictures(m)}<pre>${esc(m.content)}</pre>${calls}</div>`;
    }).join("");
    const failures = d.failures.map((f) => `<li>${esc(f.kind)}: ${esc(f.message)}</li>`).join("");
    $("detail").innerHTML =
      `<h2>Episode ${i}${training ? ` · step ${r[C.step]}` : ""} · ${esc(r[C.task])}</h2>` +
      `<div class="facts"><span>reward <b>${fmt(r[C.reward])}</b></span>` + (training ? `<span>advantage <b>${fmt(r[C.adv])}</b></span>` : "") +
      `<span>turns <b>${r[C.turns]}</b></span><span>ending <b>${esc(r[C.end])}</b></span>` +
      `<span>rewards per turn <b>[${d.rewards.map(fmt).join(", ")}]</b></span>` +
      `<span>tokens <b>${r[C.tokens]}</b> (policy ${r[C.policy]}, prompt ${d.prompt_length})</span>` +
      `<span>outcome <b>${esc(d.outcome)}</b></span>` + (d.retries ? `<span>retries <b>${d.retries}</b></span>` : "") +
      (d.versions.length ? `<span>weight versions <b>${esc(versionRange(d.versions))}</b></span>` : "") + `</div>` +
      (d.error ? `<p class="err episode-error"><b>${esc(d.error.kind)}</b>: ${esc(d.error.message)}</p>` : "") +
      (failures ? `<details open><summary>${d.failures.length} failure(s)</summary><ul class="failures">${failures}</ul></details>` : "") +
      `<h3>Messages</h3>${messages}` +
      `<h3>Tokens</h3><div class="legend"><span class="t m1">policy (loss mask 1)</span><span class="t m0">prompt, template, tool (mask 0)</span> hover a token for its id, logprob and weight version</div>` +
      `<div class="tokens">${tokens(d)}</div>`;
    document.body.dataset.detail = String(i);
  }

  // a message's images, inline, in the order its tokens show them (data URLs made by run.py)
  function pictures(m) {
    if (!m.images.length) return "";
    return `<div class="images">` + m.images.map((src, k) => src
      ? `<img class="msg-image" src="${esc(src)}" alt="image ${k + 1} of this ${esc(m.role)} message">`
      : `<span class="no-image">image ${k + 1}: not a PNG, JPEG, GIF or WebP</span>`).join("") + `</div>`;
  }

  function tokens(d) {
    const out = [];
    let position = 0, bit = 0, lp = 0;
    for (const run of d.runs) {
      for (let k = 0; k < run; k++, position++) {
        const id = d.ids[position];
        const text = vocab ? (vocab[id] ?? `[${id}]`) : `${id} `;
        const shownText = text === "" ? "∅" : text.replace(/\n/g, "↵\n");
        const version = bit && d.versions.length ? ` · weight version ${d.versions[lp]}` : "";
        const title = bit ? `#${position} id ${id} · logprob ${fmt(d.logprobs[lp++])}${version}` : `#${position} id ${id} · not trained (mask 0)`;
        out.push(`<span class="t m${bit}" title="${esc(title)}">${esc(shownText)}</span>`);
      }
      bit = 1 - bit;
    }
    return out.join("");
  }

  function versionRange(versions) {
    const lo = Math.min(...versions), hi = Math.max(...versions);
    return lo === hi ? String(lo) : `${lo}-${hi} (spans ${hi - lo + 1} versions)`;
  }

  // -- start ------------------------------------------------------------------------------------
  applyFilters();
  const wanted = /episode=(\d+)/.exec(location.hash);
  const first = wanted ? Number(wanted[1]) : shown.length ? shown[0][C.i] : null;
  document.body.dataset.listMs = performance.now().toFixed(1);
  if (first !== null && first < ROWS.length) {
    open(first).then(() => { document.body.dataset.readyMs = performance.now().toFixed(1); });
  } else {
    document.body.dataset.readyMs = performance.now().toFixed(1);
  }
})();
