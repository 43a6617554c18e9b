/* Duetime console shell (AWS): sign in with the OAuth 2.0 authorization code flow and PKCE (RFC 7636) at the
 * OIDC issuer named in <meta name="duetime-sign-in">, keep the access token in memory only, and send it as
 * "Authorization: Bearer" on every htmx request the shell makes (API Gateway's JWT authorizer reads that
 * header, never a cookie). The shell holds no data; every page comes from the API through the authorizer. */
(function () {
  "use strict";
  var KEY = "duetime.pkce";
  var conf = document.querySelector('meta[name="duetime-sign-in"]').dataset;
  var shell = location.origin + location.pathname;
  var token = null;

  function b64url(buffer) {
    var bytes = new Uint8Array(buffer), text = "";
    for (var i = 0; i < bytes.length; i++) text += String.fromCharCode(bytes[i]);
    return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function random(size) {
    return b64url(crypto.getRandomValues(new Uint8Array(size)));
  }

  function show(title, message) {
    var main = document.getElementById("main");
    var h1 = document.createElement("h1"), p = document.createElement("p");
    h1.textContent = title;
    p.textContent = message; /* text, never markup: the issuer's error text is not ours */
    p.setAttribute("role", "alert");
    main.replaceChildren(h1, p);
  }

  async function signIn() {
    var verifier = random(32), state = random(16);
    sessionStorage.setItem(KEY, JSON.stringify({ verifier: verifier, state: state }));
    var challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
    var url = new URL(conf.authorize);
    url.search = new URLSearchParams({
      response_type: "code",
      client_id: conf.client,
      redirect_uri: shell,
      scope: "openid email",
      state: state,
      code_challenge: challenge,
      code_challenge_method: "S256"
    }).toString();
    location.assign(url.toString());
  }

  async function redeem(code, state) {
    var saved = JSON.parse(sessionStorage.getItem(KEY) || "{}");
    sessionStorage.removeItem(KEY);
    if (!saved.state || saved.state !== state) {
      throw new Error("the sign-in's state does not match the one this tab sent: sign in again");
    }
    var answer = await fetch(conf.token, {
      method: "POST",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({
        grant_type: "authorization_code",
        client_id: conf.client,
        code: code,
        redirect_uri: shell,
        code_verifier: saved.verifier
      })
    });
    if (!answer.ok) throw new Error("the token endpoint answered " + answer.status);
    var body = await answer.json();
    if (!body.access_token) throw new Error("the token endpoint sent no access_token");
    return body.access_token;
  }

  document.addEventListener("htmx:configRequest", function (event) {
    if (token) event.detail.headers["Authorization"] = "Bearer " + token;
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    var xhr = event.detail.xhr;
    if (xhr && xhr.status === 401) { /* expired or revoked: sign in again (the issuer's session is quick) */
      token = null;
      signIn();
    }
  });
  document.addEventListener("htmx:pushedIntoHistory", function () {
    history.replaceState(null, "", shell); /* a reload starts at the shell, which signs in again */
  });

  async function start() {
    var params = new URLSearchParams(location.search);
    try {
      if (params.has("error")) {
        show("Sign-in failed", params.get("error_description") || params.get("error"));
      } else if (params.has("code")) {
        token = await redeem(params.get("code"), params.get("state"));
        history.replaceState(null, "", shell);
        htmx.ajax("GET", "/console/jobs", { target: "#main", select: "#main", swap: "outerHTML" });
      } else {
        await signIn();
      }
    } catch (err) {
      show("Sign-in failed", String((err && err.message) || err));
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
