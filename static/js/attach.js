// Attach a file in the composer: the paperclip button (or a file dropped on the composer) uploads it
// to the user's private corpus, then shows how far reading it has got until it is ready to be
// searched with the next questions. File names and server messages are inserted as text only.
// Loaded by chat/page.html with the upload URL, the chat's id and the size limit on its tag.
(function () {
  "use strict";
  const script = document.currentScript;
  const form = document.getElementById("composer") || document.getElementById("new-chat-form");
  if (!form || !script || !window.FormData) return;

  const uploadUrl = script.dataset.uploadUrl;
  const statusUrl = script.dataset.statusUrl; // ends in "/0/": the file's id replaces the 0
  const conversation = script.dataset.conversation || "";
  const maxBytes = Number(script.dataset.maxBytes) || 0;
  const accept = ".pdf,.md,.markdown,.html,.htm,.txt";
  const POLL_MS = 800;

  const input = document.createElement("input");
  input.type = "file";
  input.accept = accept;
  input.multiple = true;
  input.hidden = true;
  input.id = "attach-input";
  input.setAttribute("aria-label", "Attach a file");

  const button = document.createElement("button");
  button.type = "button";
  button.id = "attach-button";
  button.className = "attach-button";
  button.title = "Attach a PDF, Markdown, HTML or text file";
  button.setAttribute("aria-label", "Attach a file");
  button.appendChild(paperclip());

  const chips = document.createElement("ul");
  chips.className = "attachments";
  chips.id = "attachments";
  chips.setAttribute("aria-live", "polite");
  chips.setAttribute("aria-label", "Attached files");

  const actions = form.querySelector(".composer-actions") || form;
  actions.insertBefore(button, actions.firstChild);
  form.insertBefore(chips, form.querySelector("textarea"));
  form.appendChild(input);

  // A paperclip drawn inline (an emoji depends on the fonts the device has).
  function paperclip() {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("width", "18");
    svg.setAttribute("height", "18");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", "M21 11.5l-8.6 8.6a5.5 5.5 0 0 1-7.8-7.8l8.6-8.6a3.7 3.7 0 0 1 5.2 5.2l-8.6 8.6a1.8 1.8 0 0 1-2.6-2.6l7.9-7.9");
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", "currentColor");
    path.setAttribute("stroke-width", "2");
    path.setAttribute("stroke-linecap", "round");
    path.setAttribute("stroke-linejoin", "round");
    svg.appendChild(path);
    return svg;
  }

  function csrfToken() {
    const field = form.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  function megabytes(bytes) {
    return (bytes / (1024 * 1024)).toFixed(1).replace(/\.0$/, "") + " MB";
  }

  // One chip per file: its name, what is happening to it, and a button to dismiss it.
  function chip(name) {
    const li = document.createElement("li");
    li.className = "attachment";
    const label = document.createElement("span");
    label.className = "attachment-name";
    label.textContent = name;
    const state = document.createElement("span");
    state.className = "attachment-state muted";
    const close = document.createElement("button");
    close.type = "button";
    close.className = "link attachment-dismiss";
    close.setAttribute("aria-label", "Dismiss " + name);
    close.textContent = "×";
    close.addEventListener("click", function () { li.remove(); });
    li.append(label, state, close);
    chips.appendChild(li);
    return {
      li: li,
      set(text, status) {
        state.textContent = text;
        li.dataset.status = status;
        state.className = "attachment-state " + (status === "failed" ? "error" : "muted");
        if (status === "failed") state.setAttribute("role", "alert");
      },
    };
  }

  function follow(c, id) {
    fetch(statusUrl.replace(/\/0\/$/, "/" + id + "/"), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("status " + response.status);
        return response.json();
      })
      .then(function (state) {
        c.set(state.progress, state.status);
        if (!state.done) setTimeout(function () { follow(c, id); }, POLL_MS);
      })
      .catch(function () {
        c.set("Lost track of this file; see your profile page.", "failed");
      });
  }

  function upload(file) {
    const c = chip(file.name);
    if (maxBytes && file.size > maxBytes) {
      c.set("Too large (" + megabytes(file.size) + "); files may be at most " + megabytes(maxBytes) + ".", "failed");
      return;
    }
    const data = new FormData();
    data.append("file", file);
    if (conversation) data.append("conversation", conversation);
    // XMLHttpRequest rather than fetch: it reports the upload's own progress.
    const request = new XMLHttpRequest();
    request.open("POST", uploadUrl);
    request.setRequestHeader("X-CSRFToken", csrfToken());
    request.upload.addEventListener("progress", function (event) {
      if (event.lengthComputable) c.set("Uploading… " + Math.round(100 * event.loaded / event.total) + "%", "uploading");
    });
    request.addEventListener("load", function () {
      let body = {};
      try { body = JSON.parse(request.responseText); } catch (e) { /* not JSON: said below */ }
      if (request.status === 200 || request.status === 202) {
        c.li.dataset.fileId = body.id;
        c.set(body.duplicate ? "Attached before. " + body.progress : body.progress, body.status);
        if (!body.done) setTimeout(function () { follow(c, body.id); }, POLL_MS);
      } else {
        c.set(body.error || "The upload failed (" + request.status + ").", "failed");
      }
    });
    request.addEventListener("error", function () {
      c.set("The upload failed: no connection. Try again.", "failed");
    });
    c.set("Uploading…", "uploading");
    request.send(data);
  }

  button.addEventListener("click", function () { input.click(); });
  input.addEventListener("change", function () {
    Array.prototype.forEach.call(input.files, upload);
    input.value = "";
  });
  form.addEventListener("dragover", function (event) {
    if (event.dataTransfer && Array.prototype.indexOf.call(event.dataTransfer.types, "Files") >= 0) {
      event.preventDefault();
      form.classList.add("dropping");
    }
  });
  form.addEventListener("dragleave", function () { form.classList.remove("dropping"); });
  form.addEventListener("drop", function (event) {
    if (!event.dataTransfer || !event.dataTransfer.files.length) return;
    event.preventDefault();
    form.classList.remove("dropping");
    Array.prototype.forEach.call(event.dataTransfer.files, upload);
  });
})();
