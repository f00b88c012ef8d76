// Swagger UI over this server's OpenAPI document (FastAPI's own /docs settings; no validator
// badge: it would call another site).
/* global SwaggerUIBundle */
window.ui = SwaggerUIBundle({
  url: new URL("../openapi.json", document.currentScript.src).href,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
