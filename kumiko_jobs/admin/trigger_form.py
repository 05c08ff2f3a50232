"""The catalog's Trigger form: a tenant, a JSON payload, checked against the job, then
``dispatch()``. Every problem ``dispatch()`` would raise is shown on the form instead."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.dispatching import DispatchResult, dispatch
from kumiko_jobs.exceptions import InvalidPayload, InvalidTenant
from kumiko_jobs.tenancy import normalise_tenant, tenant_model
from kumiko_jobs.tenant_history import subject_of
from kumiko_jobs.validation import validate_payload

TRIGGER_NAME = "admin"
TENANT_CHOICES = 200
NO_TENANT = ""


class TriggerForm(forms.Form):
    tenant = forms.ChoiceField(required=False, help_text="The tenant the run is for.")
    tenant_id = forms.CharField(
        required=False, max_length=64, label="or tenant id", help_text="For a tenant not in the list."
    )
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 60, "spellcheck": "false"}),
        help_text='A JSON object, e.g. {"invoice_id": 42}. Empty means {}.',
    )

    def __init__(self, definition: JobDefinition, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.definition = definition
        field = self.fields["tenant"]
        if not isinstance(field, forms.ChoiceField):  # declared above; narrows the type
            raise TypeError("tenant must be a ChoiceField")
        none = "(no tenant: once per active tenant)" if definition.per_tenant else "(no tenant)"
        field.choices = [(NO_TENANT, none), *_tenant_choices()]

    def clean_payload(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("payload") or "").strip()
        if not text:
            return {}
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
            ) from exc
        if not isinstance(payload, dict):
            raise forms.ValidationError(f"The payload must be a JSON object, not a {type(payload).__name__}.")
        try:
            validate_payload(payload)
            subject_of(self.definition, payload)  # the job's subject fields must be primitive
        except InvalidPayload as exc:
            raise forms.ValidationError(str(exc)) from exc
        return payload

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        raw = (data.get("tenant_id") or "").strip() or data.get("tenant") or None
        try:
            data["tenant_key"] = normalise_tenant(raw)
        except InvalidTenant as exc:
            self.add_error("tenant_id" if data.get("tenant_id") else "tenant", str(exc))
        return data

    def dispatch(self, *, user: Any) -> DispatchResult:
        data = self.cleaned_data
        return dispatch(
            self.definition.name,
            data["payload"],
            tenant=data["tenant_key"],
            user=user,
            trigger_name=TRIGGER_NAME,
        )


def _tenant_choices() -> list[tuple[str, str]]:
    model = tenant_model()
    if model is None:
        return []
    tenants = model._default_manager.order_by(*(model._meta.ordering or ["pk"]))[:TENANT_CHOICES]
    return [(str(tenant.pk), f"{tenant} ({tenant.pk})") for tenant in tenants]
