// The key holder's page: the key is kept in this tab's session storage and sent as a header to
// /me/data; nothing is put in a URL. Every value is written as text, never as HTML.
"use strict";
(() => {
  const STORE = "tollgate_key";
  const $ = (id) => document.getElementById(id);
  const money = (usd) => {
    const fixed = Number(usd || 0).toFixed(6).replace(/0+$/, "");
    const [whole, frac = ""] = fixed.split(".");
    return (whole.startsWith("-") ? "-$" + whole.slice(1) : "$" + whole) + "." + frac.padEnd(2, "0");
  };
  const count = (n) => Number(n || 0).toLocaleString("en-US");
  const fill = (id, rows) => {
    const body = $(id).querySelector("tbody");
    body.replaceChildren();
    if (rows.length === 0) {
      const tr = body.insertRow();
      tr.className = "empty";
      const td = tr.insertCell();
      td.colSpan = $(id).querySelectorAll("th").length;
      td.textContent = "Nothing here.";
    }
    for (const cells of rows) {
      const tr = body.insertRow();
      for (const c of cells) tr.insertCell().textContent = c;
    }
  };
  const show = (d) => {
    $("title").textContent = "Key " + d.name;
    $("tz").textContent = "Times in " + d.timezone;
    $("balance").textContent = money(d.balance);
    $("total").textContent = count(d.total.requests) + " requests, " + money(d.total.cost);
    fill("windows", Object.entries(d.budgets).map(([w, v]) => [w, money(v.cap), money(v.spent), v.end]));
    fill("days", d.days.map((r) => [r.day, count(r.requests), money(r.cost)]));
    fill("models", d.models.map((r) => [r.model, count(r.requests), count(r.input_tokens), count(r.output_tokens), money(r.cost)]));
    fill("requests", d.requests.map((r) => [
      r.time, r.model || "—", r.route, r.refusal ? r.status + " " + r.refusal : String(r.status),
      count(r.input_tokens) + " / " + count(r.output_tokens), money(r.cost), count(r.latency_ms) + " ms", r.id,
    ]));
    $("enter").hidden = true;
    $("error").hidden = true;
    $("view").hidden = false;
    $("forget").hidden = false;
  };
  const load = async (key) => {
    const r = await fetch("/me/data", { headers: { Authorization: "Bearer " + key }, cache: "no-store" });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) {
      sessionStorage.removeItem(STORE);
      $("error").textContent = "This key was refused: " + ((body.error && body.error.message) || r.status);
      $("error").hidden = false;
      $("view").hidden = true;
      $("enter").hidden = false;
      return;
    }
    show(body);
  };
  $("enter").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("key").value.trim();
    $("key").value = "";
    sessionStorage.setItem(STORE, key);
    load(key);
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(STORE);
    location.reload();
  });
  const kept = sessionStorage.getItem(STORE);
  if (kept) load(kept);
})();
