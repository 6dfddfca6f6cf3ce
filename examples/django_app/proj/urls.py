from django.urls import path
from shop import chat, views

urlpatterns = [
    path("orders/", views.create_order),
    path("orders/<int:order_id>/", views.order),
    path("threads/<str:thread_id>/", views.thread),
    path("chat/", chat.page),
    path("chat/send", chat.send),
    path("chat/<str:thread_id>/events", chat.events),
]
