// Deck behaviour: keyboard navigation, progress bar, speaker notes, feedback notes and text edits.
// Served by `glm53 serve`, notes and edits are stored on the server (with the page's token);
// opened from file://, they stay in this browser's localStorage.
(function () {
  "use strict";
  var slides = Array.prototype.slice.call(document.querySelectorAll(".slide"));
  var token = (document.querySelector('meta[name="glm53-token"]') || {}).content || "";
  var served = location.protocol.indexOf("http") === 0 && token && token.indexOf("__GLM53") !== 0;
  var STORE = "glm53-deck-v1:";
  var current = 0;
  var feedback = load("feedback", {});
  var edits = load("text-edits", {});

  function load(name, fallback) {
    try { return JSON.parse(localStorage.getItem(STORE + name)) || fallback; } catch (e) { return fallback; }
  }
  function keep(name, value) {
    try { localStorage.setItem(STORE + name, JSON.stringify(value)); } catch (e) { /* private mode */ }
  }
  function post(path, body) {
    if (!served) { return Promise.resolve(null); }
    return fetch(path, { method: "POST", headers: { "Content-Type": "application/json", "X-GLM53-Token": token },
                         body: JSON.stringify(body) })
      .then(function (r) { if (!r.ok) { throw new Error(path + " answered " + r.status); } return r.json(); });
  }
  function status(text) { document.getElementById("feedback-status").textContent = text; }

  function show(index) {
    current = Math.max(0, Math.min(slides.length - 1, index));
    slides.forEach(function (s, i) { s.classList.toggle("active", i === current); });
    document.getElementById("bar").style.width = (100 * (current + 1) / slides.length) + "%";
    document.getElementById("counter").textContent = (current + 1) + " / " + slides.length + "  " +
      slides[current].getAttribute("data-title");
    document.getElementById("feedback-text").value = feedback[slides[current].id] || "";
    var url = new URL(location.href);
    url.searchParams.set("slide", String(current + 1));
    history.replaceState(null, "", url.toString());
  }

  function catalog() {
    var out = {};
    slides.forEach(function (s, i) {
      if (feedback[s.id]) { out[s.id] = { title: s.getAttribute("data-title"), lastKnownPosition: i + 1, lastSeenAt: null }; }
    });
    return out;
  }
  var timer = null;
  function saveFeedback() {
    keep("feedback", feedback);
    clearTimeout(timer);
    timer = setTimeout(function () {
      post("/api/feedback", { feedback: feedback, catalog: catalog() })
        .then(function (doc) { status(doc ? "saved on the server" : "saved in this browser"); })
        .catch(function (e) { status("not saved on the server: " + e.message); });
    }, 250);
  }

  function applyEdits() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-edit]"), function (el) {
      var key = el.getAttribute("data-edit");
      if (!el.hasAttribute("data-original")) { el.setAttribute("data-original", el.textContent); }
      if (Object.prototype.hasOwnProperty.call(edits, key)) { el.textContent = edits[key]; }
    });
  }
  function startEdit(el) {
    var before = el.textContent;
    el.setAttribute("contenteditable", "true");
    el.focus();
    function finish(commit) {
      el.removeAttribute("contenteditable");
      el.removeEventListener("keydown", onKey);
      el.removeEventListener("blur", onBlur);
      if (!commit) { el.textContent = before; return; }
      edits[el.getAttribute("data-edit")] = el.textContent;
      keep("text-edits", edits);
      post("/api/text-edits", { edits: edits }).catch(function (e) { status("edit not saved on the server: " + e.message); });
    }
    function onKey(ev) {
      if (ev.key === "Enter") { ev.preventDefault(); finish(true); }
      if (ev.key === "Escape") { ev.preventDefault(); finish(false); }
      ev.stopPropagation();
    }
    function onBlur() { finish(true); }
    el.addEventListener("keydown", onKey);
    el.addEventListener("blur", onBlur);
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.target && (ev.target.tagName === "TEXTAREA" || ev.target.isContentEditable)) { return; }
    if (["ArrowRight", "PageDown", " "].indexOf(ev.key) >= 0) { ev.preventDefault(); show(current + 1); }
    else if (["ArrowLeft", "PageUp"].indexOf(ev.key) >= 0) { ev.preventDefault(); show(current - 1); }
    else if (ev.key === "Home") { show(0); }
    else if (ev.key === "End") { show(slides.length - 1); }
    else if (ev.key === "s" || ev.key === "S") { document.body.classList.toggle("show-notes"); }
    else if (ev.key === "f" || ev.key === "F") { togglePanel(); }
  });
  function togglePanel() { var p = document.getElementById("feedback"); p.hidden = !p.hidden; }
  document.getElementById("toggle-notes").addEventListener("click", function () {
    document.body.classList.toggle("show-notes");
  });
  document.getElementById("toggle-feedback").addEventListener("click", togglePanel);
  document.getElementById("feedback-text").addEventListener("input", function (ev) {
    var id = slides[current].id;
    if (ev.target.value) { feedback[id] = ev.target.value; } else { delete feedback[id]; }
    saveFeedback();
  });
  document.addEventListener("dblclick", function (ev) {
    var el = ev.target.closest && ev.target.closest("[data-edit]");
    if (el) { startEdit(el); }
  });
  if (!served) { document.getElementById("playground-link").hidden = true; }

  var start = parseInt(new URL(location.href).searchParams.get("slide") || "1", 10) - 1;
  applyEdits();
  show(isNaN(start) ? 0 : start);
  status(served ? "" : "opened as a file: notes stay in this browser");
  if (served) {
    // The server's copy wins over this browser's (another browser may have written since).
    Promise.all([fetch("/api/feedback").then(function (r) { return r.json(); }),
                 fetch("/api/text-edits").then(function (r) { return r.json(); })])
      .then(function (docs) {
        feedback = Object.assign({}, feedback, docs[0].feedback);
        edits = Object.assign({}, edits, docs[1].edits);
        keep("feedback", feedback); keep("text-edits", edits);
        applyEdits();
        show(current);
        document.body.setAttribute("data-notes-loaded", "true");
      })
      .catch(function (e) { status("server notes not loaded: " + e.message); });
  }
})();
