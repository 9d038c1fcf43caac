// The qkv web page: a form over the server's JSON API (/models, /translate, /classify) and an
// explorer of the attention weights it returns. Plain browser JavaScript, no dependencies.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);

  const ui = {
    form: $("form"),
    model: $("model"),
    modelInfo: $("model-info"),
    text: $("text"),
    textLabel: $("text-label"),
    perLine: $("per-line"),
    textCount: $("text-count"),
    translateOptions: $("translate-options"),
    beam: $("beam"),
    nBest: $("n-best"),
    alpha: $("alpha"),
    sampling: $("sampling"),
    temperature: $("temperature"),
    topK: $("top-k"),
    topP: $("top-p"),
    seed: $("seed"),
    attention: $("attention"),
    submit: $("submit"),
    error: $("error"),
    results: $("results"),
    resultsMeta: $("results-meta"),
    resultList: $("result-list"),
    explorer: $("explorer"),
    exploreTextField: $("explore-text-field"),
    exploreText: $("explore-text"),
    kind: $("kind"),
    layer: $("layer"),
    head: $("head"),
    kindHelp: $("kind-help"),
    focusCaption: $("focus-caption"),
    focusStrip: $("focus-strip"),
    heatmap: $("heatmap"),
    readout: $("cell-readout"),
  };

  const state = {
    models: [],
    limits: {},
    task: null, // the task of the last answer
    texts: [],
    results: [],
    index: 0, // the result the explorer shows
    matrix: null, // the weights drawn: rows x cols
    rows: [],
    cols: [],
    activeRow: -1,
  };

  const KINDS = {
    translation: [
      ["cross", "Cross (target → source)"],
      ["encoder", "Encoder self (source → source)"],
      ["decoder", "Decoder self (target → earlier target)"],
    ],
    classification: [["encoder", "Encoder self (token → token)"]],
  };

  const HELP = {
    cross:
      "Each row is a decoding step, labelled by the token it chose; the columns are the source " +
      "tokens it attended to.",
    encoder: "Each row is a token; the columns are the tokens of the same text it attended to.",
    decoder:
      "Each row is a decoding step, labelled by the token it chose; the columns are the " +
      "decoder's inputs (<s>, then the tokens chosen before it). Steps cannot look ahead.",
  };

  // ---- small helpers -------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "style") node.setAttribute("style", value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function showError(message) {
    ui.error.textContent = message;
    ui.error.hidden = false;
  }

  function clearError() {
    ui.error.textContent = "";
    ui.error.hidden = true;
  }

  function fmtScore(x) {
    return Number.isFinite(x) ? x.toFixed(3) : String(x);
  }

  function fmtPercent(p) {
    if (p > 0 && p < 0.001) return "<0.1%";
    if (p < 1 && p > 0.999) return ">99.9%";
    return (100 * p).toFixed(1) + "%";
  }

  function fmtWeight(w) {
    return (Math.round(w * 1000) / 1000).toFixed(3);
  }

  // A colour from a CSS variable holding "r g b" and an opacity in [0, 1].
  function tint(variable, alpha) {
    const a = Math.max(0, Math.min(1, alpha));
    return `rgb(var(${variable}) / ${a.toFixed(3)})`;
  }

  // A token chip's shading for a strength x in [0, 1]: a light fill that keeps the text
  // readable in both colour schemes, and an underline in full colour.
  function chipStyle(variable, x) {
    return (
      `background-color: ${tint(variable, 0.55 * x)}; ` +
      `box-shadow: inset 0 -3px 0 ${tint(variable, x)}`
    );
  }

  // The answer's JSON, or an Error carrying the server's message and the field at fault.
  async function api(path, body) {
    let response;
    try {
      response = await fetch(path, {
        method: body === undefined ? "GET" : "POST",
        headers: body === undefined ? {} : { "Content-Type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (error) {
      throw new Error(`Could not reach the server (${error.message}).`);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (error) {
      data = null;
    }
    if (!response.ok) {
      const why = data && data.error ? data.error : `${response.status} ${response.statusText}`;
      const where = data && data.field ? ` (field: ${data.field})` : "";
      throw new Error(`The server refused the request: ${why}${where}`);
    }
    if (data === null) throw new Error(`The server's answer to ${path} is not JSON.`);
    return data;
  }

  // ---- the form ------------------------------------------------------------------------------

  function currentModel() {
    return state.models.find((m) => m.name === ui.model.value) || null;
  }

  function textsOf() {
    const raw = ui.text.value;
    if (!ui.perLine.checked) return raw.trim() ? [raw] : [];
    return raw.split(/\r?\n/).filter((line) => line.trim() !== "");
  }

  function updateCount() {
    const n = textsOf().length;
    ui.textCount.textContent = n > 1 ? `${n} texts` : "";
  }

  function updateSampling() {
    const sampling = ui.sampling.checked;
    for (const input of [ui.temperature, ui.topK, ui.topP, ui.seed]) input.disabled = !sampling;
    ui.beam.disabled = sampling;
    ui.nBest.disabled = sampling;
  }

  function adaptToModel() {
    const model = currentModel();
    if (!model) return;
    const translation = model.task === "translation";
    ui.translateOptions.hidden = !translation;
    ui.submit.textContent = translation ? "Translate" : "Classify";
    ui.textLabel.textContent = translation ? "Text to translate" : "Text to classify";
    ui.text.placeholder = translation
      ? "Type or paste a sentence to translate"
      : "Type or paste a text to classify";
    const info = [
      el("span", { class: "badge", text: model.task }),
      el("span", { class: "badge", text: `engine: ${model.engine}` }),
    ];
    if (model.labels) info.push(el("span", { text: ` labels: ${model.labels.join(", ")}` }));
    ui.modelInfo.replaceChildren(...info);
  }

  async function loadModels() {
    let data;
    try {
      data = await api("/models");
    } catch (error) {
      ui.model.replaceChildren(el("option", { text: "No models" }));
      showError(`Could not load the models: ${error.message}`);
      return;
    }
    state.models = data.models || [];
    state.limits = data.limits || {};
    if (state.models.length === 0) {
      ui.model.replaceChildren(el("option", { text: "No models" }));
      showError("The server serves no models.");
      return;
    }
    const groups = { translation: "Translation", classification: "Classification" };
    const options = [];
    for (const [task, title] of Object.entries(groups)) {
      const models = state.models.filter((m) => m.task === task);
      if (models.length === 0) continue;
      options.push(
        el(
          "optgroup",
          { label: title },
          ...models.map((m) => el("option", { value: m.name, "data-task": m.task, text: m.name })),
        ),
      );
    }
    ui.model.replaceChildren(...options);
    ui.model.value = state.models[0].name;
    ui.model.disabled = false;
    ui.submit.disabled = false;
    adaptToModel();
  }

  function intOf(input, name) {
    const value = Number(input.value);
    if (input.value.trim() === "" || !Number.isInteger(value)) {
      throw new Error(`${name} must be a whole number.`);
    }
    return value;
  }

  function numberOf(input, name) {
    const value = Number(input.value);
    if (input.value.trim() === "" || !Number.isFinite(value)) {
      throw new Error(`${name} must be a number.`);
    }
    return value;
  }

  function requestBody(model, texts) {
    // The server gives attention weights for a few texts a request: more texts, none asked.
    const cap = state.limits.max_attention_texts;
    const attention = ui.attention.checked && !(cap && texts.length > cap);
    state.attentionSkipped = ui.attention.checked && !attention ? cap : 0;
    const body = { texts, model: model.name, attention };
    if (model.task !== "translation") return body;
    if (ui.sampling.checked) {
      Object.assign(body, {
        sampling: true,
        n_best: 1,
        temperature: numberOf(ui.temperature, "Temperature"),
        top_k: intOf(ui.topK, "Top-k"),
        top_p: numberOf(ui.topP, "Top-p"),
        seed: intOf(ui.seed, "Seed"),
      });
    } else {
      const beam = intOf(ui.beam, "Beam width");
      const nBest = intOf(ui.nBest, "N-best");
      if (nBest > beam) {
        throw new Error(`N-best (${nBest}) cannot exceed the beam width (${beam}).`);
      }
      Object.assign(body, { beam, n_best: nBest });
    }
    body.alpha = numberOf(ui.alpha, "Length penalty α");
    return body;
  }

  async function onSubmit(event) {
    event.preventDefault();
    clearError();
    const model = currentModel();
    if (!model) {
      showError("Choose a model first.");
      return;
    }
    const texts = textsOf();
    if (texts.length === 0) {
      showError("Type or paste some text first.");
      ui.text.focus();
      return;
    }
    let body;
    try {
      body = requestBody(model, texts);
    } catch (error) {
      showError(error.message);
      return;
    }
    const label = ui.submit.textContent;
    ui.submit.disabled = true;
    ui.submit.textContent = model.task === "translation" ? "Translating…" : "Classifying…";
    ui.results.setAttribute("aria-busy", "true");
    const started = performance.now();
    try {
      const path = model.task === "translation" ? "/translate" : "/classify";
      const answer = await api(path, body);
      const ms = performance.now() - started;
      render(model.task, texts, answer, ms);
    } catch (error) {
      showError(error.message);
    } finally {
      ui.submit.disabled = false;
      ui.submit.textContent = label;
      ui.results.removeAttribute("aria-busy");
    }
  }

  // ---- results -------------------------------------------------------------------------------

  function render(task, texts, answer, ms) {
    state.task = task;
    state.texts = texts;
    state.results = answer.results || [];
    const n = state.results.length;
    const skipped = state.attentionSkipped
      ? ` (attention weights are given for at most ${state.attentionSkipped} texts)`
      : "";
    ui.resultsMeta.textContent =
      `${n} ${n === 1 ? "result" : "results"} from ${answer.model} in ${Math.round(ms)} ms` +
      skipped;
    const cards = state.results.map((result, i) =>
      task === "translation"
        ? translationCard(result, texts[i], i)
        : classificationCard(result, texts[i], i),
    );
    ui.resultList.replaceChildren(...cards);
    ui.results.hidden = false;
    ui.results.dataset.answers = String(Number(ui.results.dataset.answers || 0) + 1);
    const withAttention = state.results.some((r) => r.attention);
    if (withAttention) {
      setupExplorer(0);
    } else {
      ui.explorer.hidden = true;
    }
  }

  function sourceLine(text, i) {
    const shown = text.length > 300 ? text.slice(0, 300) + "…" : text;
    const number = state.texts.length > 1 ? `${i + 1}. ` : "";
    return el("p", { class: "source", "data-testid": "source" }, number, shown);
  }

  function exploreButton(result, i) {
    if (!result.attention || state.results.length < 2) return null;
    const button = el("button", {
      type: "button",
      class: "explore-link",
      text: "Explore its attention",
    });
    button.addEventListener("click", () => {
      setupExplorer(i);
      ui.explorer.scrollIntoView({ behavior: "smooth", block: "start" });
    });
    return button;
  }

  function translationCard(result, text, i) {
    const items = (result.n_best || []).map((h) =>
      el(
        "li",
        { "data-testid": "hypothesis", "data-score": h.score },
        el("span", { class: "hyp", text: h.text }),
        el("span", { class: "score", text: `score ${fmtScore(h.score)}` }),
      ),
    );
    return el(
      "article",
      { class: "card result", "data-testid": "result", "data-index": i },
      sourceLine(text, i),
      el("p", { class: "translation", "data-testid": "translation", text: result.translation }),
      el("span", {
        class: "score",
        "data-testid": "score",
        text: `score ${fmtScore(result.score)}`,
      }),
      items.length > 1
        ? el("h3", { class: "visually-hidden", text: "N-best translations" })
        : null,
      items.length > 1 ? el("ol", { class: "nbest", "data-testid": "n-best" }, ...items) : null,
      exploreButton(result, i),
    );
  }

  function classificationCard(result, text, i) {
    const rows = Object.entries(result.probabilities || {}).map(([name, p]) =>
      el(
        "li",
        {
          class: name === result.label ? "prob best" : "prob",
          "data-testid": "probability",
          "data-label": name,
          "data-probability": p,
        },
        el("span", { class: "name", text: name }),
        el(
          "span",
          { class: "track", "aria-hidden": "true" },
          el("span", { class: "fill", style: `width: ${(100 * p).toFixed(2)}%` }),
        ),
        el("span", { class: "pct", text: fmtPercent(p) }),
      ),
    );
    return el(
      "article",
      { class: "card result", "data-testid": "result", "data-index": i },
      sourceLine(text, i),
      el(
        "p",
        { class: "label-out" },
        "Label: ",
        el("span", { "data-testid": "label", text: result.label }),
      ),
      el("ul", { class: "probs", "aria-label": "Probability of each label" }, ...rows),
      result.attention ? tokenWeights(result.attention) : null,
      exploreButton(result, i),
    );
  }

  // The tokens of a classified text coloured by how much each weighs in the decision.
  function tokenWeights(attention) {
    const weights = attention.token_weights || [];
    const largest = Math.max(1e-12, ...weights.map(Math.abs));
    const meaning = attention.token_weights_meaning || "";
    const signed = weights.some((w) => w < 0) || /logit/.test(meaning);
    const chips = (attention.tokens || []).map((token, i) => {
      const w = weights[i] ?? 0;
      const alpha = Math.abs(w) / largest;
      const colour = w < 0 ? "--neg" : "--pos";
      return el(
        "span",
        {
          class: "tok",
          "data-testid": "token-weight",
          "data-weight": w,
          style: chipStyle(colour, alpha),
          title: `${token}: ${w}`,
        },
        token,
        el("small", { text: signed && w > 0 ? `+${fmtWeight(w)}` : fmtWeight(w) }),
      );
    });
    const ranked = (attention.tokens || [])
      .map((token, i) => [token, weights[i] ?? 0])
      .sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]))
      .slice(0, 3)
      .map(([token]) => token);
    return el(
      "div",
      { class: "weights" },
      el(
        "p",
        { class: "hint weights-caption" },
        `Token weights: ${attention.token_weights_meaning} (label ${attention.label}). ` +
          (signed ? "Green pushes towards the label, red away from it. " : "") +
          (ranked.length ? `Weighing most: ${ranked.join(", ")}.` : ""),
      ),
      el("div", { class: "strip", "data-testid": "token-weights" }, ...chips),
    );
  }

  // ---- attention explorer --------------------------------------------------------------------

  function fillSelect(select, options, value) {
    select.replaceChildren(...options.map(([v, text]) => el("option", { value: v, text })));
    if (value !== undefined && options.some(([v]) => String(v) === String(value))) {
      select.value = String(value);
    }
  }

  function setupExplorer(index) {
    state.index = index;
    const withAttention = state.results
      .map((r, i) => [i, r])
      .filter(([, r]) => r.attention);
    fillSelect(
      ui.exploreText,
      withAttention.map(([i]) => {
        const text = state.texts[i] || "";
        return [i, `${i + 1}. ${text.length > 40 ? text.slice(0, 40) + "…" : text}`];
      }),
      index,
    );
    ui.exploreTextField.hidden = withAttention.length < 2;
    const kinds = KINDS[state.task];
    const kind = kinds.some(([k]) => k === ui.kind.value) ? ui.kind.value : kinds[0][0];
    fillSelect(ui.kind, kinds, kind);
    setupLayers();
    ui.explorer.hidden = false;
  }

  function maps() {
    const attention = state.results[state.index].attention;
    return attention[ui.kind.value] || [];
  }

  function setupLayers() {
    const layers = maps();
    const nLayers = layers.length;
    const nHeads = nLayers ? layers[0].length : 0;
    const previousLayer = ui.layer.value;
    const previousHead = ui.head.value;
    const layerOptions = [["mean", "Mean of layers"]];
    for (let l = 0; l < nLayers; l++) layerOptions.push([l, `${l + 1} of ${nLayers}`]);
    const headOptions = [["mean", "Mean of heads"]];
    for (let h = 0; h < nHeads; h++) headOptions.push([h, `${h + 1} of ${nHeads}`]);
    const keepLayer = previousLayer !== "" && Number(previousLayer) < nLayers;
    const keepHead = previousHead !== "" && Number(previousHead) < nHeads;
    const layerDefault = keepLayer ? previousLayer : nLayers - 1;
    const headDefault = keepHead ? previousHead : "mean";
    fillSelect(ui.layer, layerOptions, layerDefault);
    fillSelect(ui.head, headOptions, headDefault);
    draw();
  }

  // The selected layer's (or the mean of the layers') selected head (or mean of the heads).
  function selectedMatrix() {
    const layers = maps();
    const chosenLayers = ui.layer.value === "mean" ? layers : [layers[Number(ui.layer.value)]];
    const matrices = [];
    for (const heads of chosenLayers) {
      if (ui.head.value === "mean") matrices.push(...heads);
      else matrices.push(heads[Number(ui.head.value)]);
    }
    const rows = matrices[0].length;
    const cols = rows ? matrices[0][0].length : 0;
    const out = [];
    for (let i = 0; i < rows; i++) {
      const row = new Array(cols).fill(0);
      for (const m of matrices) for (let j = 0; j < cols; j++) row[j] += m[i][j];
      for (let j = 0; j < cols; j++) row[j] /= matrices.length;
      out.push(row);
    }
    return out;
  }

  function axisLabels() {
    const a = state.results[state.index].attention;
    if (state.task === "classification") return [a.tokens, a.tokens];
    const kind = ui.kind.value;
    if (kind === "encoder") return [a.source_tokens, a.source_tokens];
    if (kind === "cross") return [a.target_tokens, a.source_tokens];
    return [a.target_tokens, ["<s>", ...a.target_tokens.slice(0, -1)]];
  }

  function draw() {
    const matrix = selectedMatrix();
    const [rows, cols] = axisLabels();
    state.matrix = matrix;
    state.rows = rows;
    state.cols = cols;
    const largest = Math.max(1e-12, ...matrix.map((row) => Math.max(...row)));
    ui.kindHelp.textContent =
      `${HELP[ui.kind.value]} Stronger colour, more weight; ` +
      `full colour is ${fmtWeight(largest)}, the largest weight shown.`;

    const head = el(
      "tr",
      {},
      el("th", { class: "corner", scope: "col" }, el("span", { text: "" })),
      ...cols.map((token, j) =>
        el("th", { scope: "col", "data-col": j, title: token }, el("span", { text: token })),
      ),
    );
    const body = matrix.map((values, i) =>
      el(
        "tr",
        { "data-row": i, "data-testid": "heatmap-row" },
        el("th", {
          scope: "row",
          tabindex: 0,
          "data-row": i,
          title: `${rows[i]} (row ${i + 1})`,
          text: rows[i],
        }),
        ...values.map((w, j) =>
          el("td", {
            "data-row": i,
            "data-col": j,
            "data-weight": w.toFixed(4),
            style: `background-color: ${tint("--heat", w / largest)}`,
            title: `${rows[i]} → ${cols[j]}: ${fmtWeight(w)}`,
          }),
        ),
      ),
    );
    ui.heatmap.replaceChildren(
      el("caption", {
        class: "visually-hidden",
        text: `Attention weights, ${ui.kind.selectedOptions[0].text}`,
      }),
      el("thead", {}, head),
      el("tbody", {}, ...body),
    );
    ui.readout.textContent = "\u00a0";
    const active = state.activeRow;
    state.activeRow = -1;
    if (active >= 0 && active < rows.length) focusRow(active);
    else resetStrip();
  }

  function resetStrip() {
    ui.focusCaption.textContent =
      "Hover a row (or focus its label) to see what that token attends to.";
    ui.focusStrip.replaceChildren(
      ...state.cols.map((token, j) => el("span", { class: "tok", "data-col": j, text: token })),
    );
    delete ui.focusStrip.dataset.row;
  }

  // Highlight row i, and shade the column tokens by that row's weights (its largest in full).
  function focusRow(i) {
    if (i === state.activeRow || !state.matrix || i < 0 || i >= state.matrix.length) return;
    const previous = ui.heatmap.querySelector("tr.active");
    if (previous) previous.classList.remove("active");
    const tr = ui.heatmap.querySelector(`tbody tr[data-row="${i}"]`);
    if (tr) tr.classList.add("active");
    state.activeRow = i;
    const row = state.matrix[i];
    const largest = Math.max(1e-12, ...row);
    const chips = state.cols.map((token, j) => {
      const alpha = row[j] / largest;
      return el(
        "span",
        {
          class: "tok",
          "data-col": j,
          "data-weight": row[j].toFixed(4),
          style: chipStyle("--heat", alpha),
          title: `${token}: ${fmtWeight(row[j])}`,
        },
        token,
        el("small", { text: fmtWeight(row[j]) }),
      );
    });
    ui.focusStrip.replaceChildren(...chips);
    ui.focusStrip.dataset.row = String(i);
    const top = row.indexOf(Math.max(...row));
    ui.focusCaption.replaceChildren(
      "Row ",
      el("span", { class: "tok", text: state.rows[i] }),
      ` (${i + 1} of ${state.rows.length}) attends most to `,
      el("span", { class: "tok", text: state.cols[top] }),
      ` (${fmtWeight(row[top])}):`,
    );
  }

  function onHeatmapOver(event) {
    const cell = event.target.closest("td, th");
    if (!cell || !ui.heatmap.contains(cell)) return;
    const tr = cell.closest("tbody tr");
    if (tr) focusRow(Number(tr.dataset.row));
    if (cell.tagName === "TD") {
      const i = Number(cell.dataset.row);
      const j = Number(cell.dataset.col);
      const weight = fmtWeight(state.matrix[i][j]);
      ui.readout.textContent = `${state.rows[i]} → ${state.cols[j]}: ${weight}`;
    }
  }

  function onHeatmapKey(event) {
    const th = event.target.closest("tbody th");
    if (!th) return;
    const i = Number(th.dataset.row);
    const next = event.key === "ArrowDown" ? i + 1 : event.key === "ArrowUp" ? i - 1 : null;
    if (next === null) return;
    const target = ui.heatmap.querySelector(`tbody th[data-row="${next}"]`);
    if (target) {
      event.preventDefault();
      target.focus();
    }
  }

  // ---- wiring --------------------------------------------------------------------------------

  ui.form.addEventListener("submit", onSubmit);
  ui.model.addEventListener("change", () => {
    clearError();
    adaptToModel();
  });
  ui.text.addEventListener("input", updateCount);
  ui.perLine.addEventListener("change", updateCount);
  ui.text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      ui.form.requestSubmit();
    }
  });
  ui.sampling.addEventListener("change", updateSampling);
  ui.exploreText.addEventListener("change", () => {
    state.activeRow = -1;
    setupExplorer(Number(ui.exploreText.value));
  });
  ui.kind.addEventListener("change", () => {
    state.activeRow = -1;
    setupLayers();
  });
  ui.layer.addEventListener("change", draw);
  ui.head.addEventListener("change", draw);
  ui.heatmap.addEventListener("mouseover", onHeatmapOver);
  ui.heatmap.addEventListener("focusin", onHeatmapOver);
  ui.heatmap.addEventListener("keydown", onHeatmapKey);

  updateSampling();
  loadModels();
})();
