// The chat page's everyday tools, beside chat.js (which calls window.sluiceFollow, sends frames
// through window.sluiceChat and announces every frame as a "sluice:frame" event):
// - following the answer: the list sticks to the bottom unless the reader scrolled up, then a
//   "Jump to latest" button shows;
// - copy buttons on answers and code blocks; editing a sent question;
// - the user's other tabs kept in step (sidebar, titles, deletions, edits);
// - keyboard shortcuts and their help dialog.
// Nothing here inserts model text as HTML: copies read innerText, edits textContent.
(function () {
  "use strict";
  const list = document.getElementById("message-list");
  const jump = document.getElementById("jump-latest");
  const help = document.getElementById("help-dialog");
  const NEAR_BOTTOM_PX = 48;

  // A polite live region: "Copied", "Stopped"… said to screen readers without moving focus.
  const announcer = document.createElement("div");
  announcer.className = "visually-hidden";
  announcer.setAttribute("role", "status");
  document.body.appendChild(announcer);
  function announce(text) {
    announcer.textContent = "";
    setTimeout(function () { announcer.textContent = text; }, 30);
  }

  function composerBox() {
    return document.querySelector("#composer textarea, #new-chat-form textarea");
  }

  // -- following the answer ----------------------------------------------------------------------

  let stuck = true; // the reader is at the bottom: new text keeps it in view
  let seenTop = 0; // the list's scrollTop when last looked at
  function distanceFromBottom() {
    return list.scrollHeight - list.scrollTop - list.clientHeight;
  }
  function showJump() {
    if (jump) jump.hidden = stuck || distanceFromBottom() <= NEAR_BOTTOM_PX;
  }
  function toBottom() {
    list.scrollTop = list.scrollHeight;
    seenTop = list.scrollTop;
    stuck = true;
    showJump();
  }
  window.sluiceFollow = function () {
    if (!list) return;
    // A scroll event comes a frame after the scroll: text that lands in between must not pull
    // back down a reader who has just moved up (new text below never lowers scrollTop).
    if (stuck && list.scrollTop < seenTop - 1 && distanceFromBottom() > NEAR_BOTTOM_PX) {
      stuck = false;
    }
    if (stuck) toBottom();
    else showJump();
  };
  if (list) {
    list.addEventListener("scroll", function () {
      seenTop = list.scrollTop;
      stuck = distanceFromBottom() <= NEAR_BOTTOM_PX;
      showJump();
    }, { passive: true });
    // Whatever grows the list (streamed text, a final render, buttons other scripts add, late
    // layout) keeps the end in view while the reader is there: a reload lands on the latest.
    new MutationObserver(function () { window.sluiceFollow(); })
      .observe(list, { childList: true, subtree: true, characterData: true });
    window.addEventListener("load", function () { if (stuck) toBottom(); });
  }
  if (jump) jump.addEventListener("click", function () { toBottom(); });
  const composerForm = document.getElementById("composer");
  if (composerForm) composerForm.addEventListener("submit", function () { stuck = true; });

  // -- copy --------------------------------------------------------------------------------------

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () { return legacyCopy(text); });
    }
    return Promise.resolve(legacyCopy(text));
  }
  function legacyCopy(text) {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } finally { area.remove(); }
  }
  function copied(button, label) {
    button.textContent = "Copied";
    announce("Copied to the clipboard.");
    setTimeout(function () { button.textContent = label; }, 1500);
  }
  function toolButton(label, className, onClick) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = className;
    button.textContent = label;
    button.addEventListener("click", onClick);
    return button;
  }
  // The answer as read on screen: code-copy buttons hidden while it is read (innerText skips
  // what is not displayed).
  function answerText(li) {
    li.classList.add("copying");
    const text = li.querySelector(".text").innerText;
    li.classList.remove("copying");
    return text.trim();
  }

  function decorateCode(li) {
    li.querySelectorAll(".text pre").forEach(function (pre) {
      if (pre.parentElement.classList.contains("code-block")) return;
      const wrap = document.createElement("div");
      wrap.className = "code-block";
      pre.parentElement.insertBefore(wrap, pre);
      wrap.appendChild(pre);
      const button = toolButton("Copy code", "code-copy", function () {
        copyText(pre.innerText).then(function () { copied(button, "Copy code"); });
      });
      wrap.insertBefore(button, pre);
    });
  }

  function toolsRow(li) {
    let row = li.querySelector(":scope > .message-tools");
    if (!row) {
      row = document.createElement("div");
      row.className = "message-tools";
      li.appendChild(row);
    }
    return row;
  }

  function decorate(li) {
    if (li.classList.contains("pending") || !li.querySelector(".text")) return;
    if (li.classList.contains("assistant")) {
      decorateCode(li);
      const row = toolsRow(li);
      if (!row.querySelector(".copy-answer")) {
        const button = toolButton("Copy", "copy-answer", function () {
          copyText(answerText(li)).then(function () { copied(button, "Copy"); });
        });
        button.setAttribute("aria-label", "Copy the answer");
        row.appendChild(button);
      }
    } else if (li.classList.contains("user") && li.dataset.messageId && window.sluiceChat) {
      const row = toolsRow(li);
      if (!row.querySelector(".edit-message")) {
        const button = toolButton("Edit", "edit-message", function () { startEdit(li); });
        button.setAttribute("aria-label", "Edit this question");
        row.appendChild(button);
      }
    }
  }
  function decorateAll() {
    if (list) list.querySelectorAll(":scope > li.message").forEach(decorate);
  }

  // -- edit a sent question ------------------------------------------------------------------------
  // Sending the edit discards the question's old answer and everything after it (turns.py).

  function startEdit(li) {
    if (li.querySelector(".edit-form")) return;
    const textEl = li.querySelector(".text");
    const form = document.createElement("form");
    form.className = "edit-form";
    const area = document.createElement("textarea");
    area.value = textEl.innerText.trim();
    area.rows = Math.min(10, Math.max(2, area.value.split("\n").length));
    area.setAttribute("aria-label", "Edit your question");
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = "Sending replaces this question and everything after it.";
    const row = document.createElement("div");
    row.className = "row";
    const cancel = toolButton("Cancel", "edit-cancel", stop);
    const save = document.createElement("button");
    save.type = "submit";
    save.className = "primary";
    save.textContent = "Send edit";
    row.append(cancel, save);
    form.append(area, note, row);
    textEl.hidden = true;
    li.insertBefore(form, textEl.nextSibling);
    area.focus();

    function stop() {
      form.remove();
      textEl.hidden = false;
      const edit = li.querySelector(".edit-message");
      if (edit) edit.focus();
    }
    form.addEventListener("keydown", function (event) {
      if (event.key === "Escape") { event.preventDefault(); event.stopPropagation(); stop(); }
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      const text = area.value.trim();
      if (!text) { area.focus(); return; }
      stuck = true;
      if (!window.sluiceChat.send({ type: "edit", message_id: Number(li.dataset.messageId), text: text })) {
        note.textContent = "Not connected; try again in a moment.";
      }
    });
  }

  function truncateFrom(messageId) {
    const first = list && list.querySelector('li[data-message-id="' + messageId + '"]');
    if (!first) return;
    let node = first;
    while (node) {
      const next = node.nextElementSibling;
      node.remove();
      node = next;
    }
  }

  // -- other tabs ----------------------------------------------------------------------------------

  const sidebarList = document.querySelector("#sidebar .conversation-list");
  function conversationUrl(id) {
    return "/c/" + id + "/";
  }
  function sidebarItem(id) {
    if (!sidebarList) return null;
    const link = sidebarList.querySelector('a[href="' + conversationUrl(id) + '"]');
    return link ? link.closest("li") : null;
  }
  function setTitle(frame) {
    if (!frame.title) return;
    let item = sidebarItem(frame.id);
    if (!item && sidebarList) {
      const empty = sidebarList.querySelector("li.muted");
      if (empty) empty.remove();
      item = document.createElement("li");
      const link = document.createElement("a");
      link.href = conversationUrl(frame.id);
      item.appendChild(link);
      sidebarList.insertBefore(item, sidebarList.firstChild);
    }
    if (item) item.querySelector("a").textContent = frame.title;
    if (frame.current) {
      const heading = document.querySelector(".conversation-header h1");
      if (heading) heading.textContent = frame.title;
      const input = document.querySelector(".conversation-header input[name=title]");
      if (input && document.activeElement !== input) input.value = frame.title;
      document.title = frame.title + " · Sluice";
    }
    return item;
  }
  function onConversation(frame) {
    if (frame.action === "deleted") {
      const item = sidebarItem(frame.id);
      if (item) item.remove();
      if (frame.current) location.assign("/");
      return;
    }
    const item = setTitle(frame);
    // A question moves its chat to the top, as the sidebar is ordered by last activity.
    if (frame.action === "question" && item && sidebarList && sidebarList.firstChild !== item) {
      sidebarList.insertBefore(item, sidebarList.firstChild);
    }
  }

  document.addEventListener("sluice:frame", function (event) {
    const frame = event.detail;
    if (frame.type === "conversation") onConversation(frame);
    else if (frame.type === "truncate") truncateFrom(frame.from_message_id);
    else if (frame.type === "final") decorateAll();
    else if (frame.type === "user_message") {
      decorateAll();
      const mine = sidebarList && sidebarList.querySelector("li.current");
      if (mine && sidebarList.firstElementChild !== mine) sidebarList.insertBefore(mine, sidebarList.firstChild);
    }
  });

  // -- keyboard ------------------------------------------------------------------------------------

  function openHelp() {
    if (help && !help.open) help.showModal();
  }
  document.addEventListener("keydown", function (event) {
    const mod = event.ctrlKey || event.metaKey;
    if (mod && event.shiftKey && (event.key === "O" || event.key === "o")) {
      event.preventDefault();
      const link = document.getElementById("new-chat-link");
      location.assign(link ? link.href : "/c/new/");
    } else if (event.shiftKey && event.key === "Escape") {
      event.preventDefault();
      const box = composerBox();
      if (box) box.focus();
    } else if (mod && event.key === "/") {
      event.preventDefault();
      openHelp();
    } else if (event.key === "Escape" && !event.shiftKey && !(help && help.open)) {
      const stopButton = document.getElementById("stop-button");
      if (stopButton && !stopButton.hidden) {
        event.preventDefault();
        stopButton.click();
        announce("Stopping the answer.");
      }
    }
  });
  if (help) {
    const nav = document.querySelector(".topbar nav");
    if (nav) {
      const button = toolButton("⌨", "link help-button", openHelp);
      button.setAttribute("aria-haspopup", "dialog");
      button.setAttribute("aria-label", "Keyboard shortcuts");
      button.title = "Keyboard shortcuts (Ctrl+/)";
      nav.insertBefore(button, nav.firstChild);
    }
  }

  // The new-chat composer sends on Enter as the conversation's does (Shift+Enter: a new line).
  const newChat = document.getElementById("new-chat-form");
  if (newChat) {
    newChat.querySelector("textarea").addEventListener("keydown", function (event) {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        newChat.requestSubmit();
      }
    });
  }

  // chat.js runs after this file: decorate once it has set up window.sluiceChat.
  document.addEventListener("DOMContentLoaded", decorateAll);
})();
